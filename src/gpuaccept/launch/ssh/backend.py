"""The ssh backend: options from flags, the plan, and submit, poll, cancel and gather (see the package docstring)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar, TextIO

from gpuaccept.argtypes import whole_seconds
from gpuaccept.errors import ConfigError, InputError, UsageError
from gpuaccept.launch.base import Backend, JobState, Plan, Submission, read_reports
from gpuaccept.launch.hosts import (
    Host,
    parse_host_list,
    parse_hostfile,
    parse_ssh_config,
    resolve_alias,
    select_aliases,
)
from gpuaccept.launch.secrets import redact_env, secret_values
from gpuaccept.launch.spec import JobSpec
from gpuaccept.launch.ssh.fanout import LOCAL_GRACE_S, HostRun, SshJob, parallel
from gpuaccept.launch.ssh.options import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REMOTE_DIR,
    SshOptions,
)
from gpuaccept.launch.ssh.plan import (
    SCRIPT_NAME,
    kill_command,
    layout,
    master_addr,
    master_port,
    remote_run_dir,
    run_argv,
    scp_argv,
    scp_path,
    ssh_argv,
    uses_torchrun,
)
from gpuaccept.launch.ssh.preflight import preflight
from gpuaccept.launch.ssh.script import node_script
from gpuaccept.model import NodeReport


class SshBackend(Backend):
    """Hosts from --hosts, --hostfile or ssh config aliases (--ssh-config-hosts); reports come back with scp.

    One process, or one torchrun for a distributed job, per host; output is
    streamed with a [host] prefix; remote processes are stopped on Ctrl-C,
    failure or a lost connection. An unreachable host stops the launch before
    anything starts.
    """

    name: ClassVar[str] = "ssh"
    help: ClassVar[str] = "run on hosts over ssh (one process or torchrun per host), fetch reports with scp"

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self._ready: set[tuple[str, str]] = set()

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("ssh")
        g.add_argument("--hosts", action="append", default=None, metavar="A,B,user@C:2222",
                       help="hosts to run on, in node-rank order (repeatable)")
        g.add_argument("--hostfile", default=None, metavar="FILE",
                       help="one host per line: ENTRY [slots=N] [user=U] [port=P] [identity=KEY]; # comments")
        g.add_argument("--ssh-config", default=None, metavar="FILE", help="ssh config file (ssh -F); "
                       "default: ssh's own (~/.ssh/config)")
        g.add_argument("--ssh-config-hosts", default=None, metavar="PATTERN",
                       help="take the Host aliases of the ssh config that match PATTERN (e.g. 'gpu-*')")
        g.add_argument("--user", default=None, help="remote user where a host does not name one")
        g.add_argument("--port", type=int, default=None, help="ssh port where a host does not name one")
        g.add_argument("--identity", default=None, metavar="KEY", help="private key (ssh -i)")
        g.add_argument("--ssh-option", action="append", default=None, metavar="KEY=VALUE",
                       help="extra ssh -o option (repeatable), e.g. ProxyJump=bastion")
        g.add_argument("--connect-timeout", type=whole_seconds, default=DEFAULT_CONNECT_TIMEOUT_S, metavar="DURATION",
                       help=f"time to wait for each connection (default {DEFAULT_CONNECT_TIMEOUT_S}s)")
        g.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                       help=f"at most N hosts connected at once (default {DEFAULT_MAX_CONNECTIONS})")
        g.add_argument("--remote-python", default=None, metavar="PATH",
                       help="Python on the hosts, with gpuaccept (and torch) installed (default: --python, "
                            "python3)")
        g.add_argument("--remote-dir", default=DEFAULT_REMOTE_DIR, metavar="DIR",
                       help=f"results directory on each host; RUN_ID/HOST below it (default {DEFAULT_REMOTE_DIR})")
        g.add_argument("--rendezvous", choices=("static", "c10d"), default="static",
                       help="torchrun rendezvous on the first host (default static: ranks follow the host list)")
        g.add_argument("--master-addr", default=None, metavar="ADDR",
                       help="address the hosts use to reach the first one (default: its HostName or name)")
        g.add_argument("--master-port", type=int, default=None, metavar="PORT",
                       help="rendezvous port (default: derived from the run id)")
        g.add_argument("--fail-fast", action=argparse.BooleanOptionalAction, default=None,
                       help="stop every host when one fails (default: on for distributed jobs)")

    @classmethod
    def options_from_args(cls, args: argparse.Namespace) -> dict[str, Any]:
        """Read the host sources (files are read here, so the plan stays pure) into validated options."""
        if getattr(args, "detach", False):
            raise UsageError("--detach: the ssh backend holds one connection per host for the job's lifetime and "
                             "stops the job when the launcher exits; run the launch under tmux/screen/nohup instead")
        hosts: list[Host] = []
        for text in args.hosts or []:
            hosts.extend(parse_host_list(text, "--hosts"))
        if args.hostfile:
            hosts.extend(parse_hostfile(_read(args.hostfile, "--hostfile"), args.hostfile))
        config_path = args.ssh_config
        if config_path is not None:
            _read(config_path, "--ssh-config")
        blocks = []
        default_config = Path.home() / ".ssh" / "config"
        readable = config_path or (str(default_config) if default_config.is_file() else None)
        if readable:
            try:
                blocks = parse_ssh_config(_read(readable, "--ssh-config"), readable)
            except ConfigError:
                # ssh reads its default config itself; only a config we were told to use must parse here
                if config_path or args.ssh_config_hosts:
                    raise
        if args.ssh_config_hosts:
            if not readable:
                raise ConfigError("--ssh-config-hosts", args.ssh_config_hosts,
                                  f"no ssh config to read ({default_config} does not exist; pass --ssh-config)")
            hosts.extend(select_aliases(blocks, args.ssh_config_hosts))
        if not hosts:
            raise ConfigError("launch ssh", "", "no hosts: give --hosts, --hostfile or --ssh-config-hosts")
        for name, value in (("--connect-timeout", args.connect_timeout), ("--max-connections", args.max_connections)):
            if value < 1:
                raise ConfigError(name, str(value), "must be at least 1")
        addr = args.master_addr
        if addr is None and blocks:
            addr = resolve_alias(blocks, hosts[0].name).hostname
        options: dict[str, Any] = {
            "hosts": [str(h) for h in hosts], "ssh_config": config_path, "user": args.user, "port": args.port,
            "identity": args.identity, "ssh_options": list(args.ssh_option or []),
            "connect_timeout_s": args.connect_timeout, "max_connections": args.max_connections,
            "remote_python": args.remote_python, "remote_dir": args.remote_dir, "rendezvous": args.rendezvous,
            "master_addr": addr, "master_port": args.master_port, "fail_fast": args.fail_fast,
        }
        SshOptions.from_dict(options, "launch ssh")
        return options

    # -- pure

    def plan(self, spec: JobSpec) -> Plan:
        opts = SshOptions.from_dict(spec.options)
        if spec.image:
            raise ConfigError("--image", spec.image, "the ssh backend runs directly on the hosts, without a "
                                                     "container runtime (use slurm with pyxis, or k8s)")
        if spec.mounts:
            raise ConfigError("--mount", str(spec.mounts[0]), "the ssh backend has no container to mount into")
        slots = layout(spec, opts)
        if uses_torchrun(spec) and len(slots) > opts.max_connections:
            raise ConfigError("--max-connections", str(opts.max_connections),
                              f"a distributed job needs all {len(slots)} hosts connected at once; "
                              f"raise it to at least {len(slots)}")
        run_dir = remote_run_dir(spec, opts)
        python = opts.remote_python or spec.python
        needs = "gpuaccept" if spec.command is None else "torch" if uses_torchrun(spec) else ""
        notes = [
            f"each command reads {SCRIPT_NAME} on standard input; at most {opts.max_connections} run at once",
            f"before launch, every host is checked: reachable, {python} runs"
            + (f" and imports {needs}" if needs else "") + (f", {spec.workdir} exists" if spec.workdir else ""),
            f"reports are fetched with scp -r HOST:{run_dir}/LABEL into {spec.run_results_dir}/LABEL",
        ]
        if len(opts.hosts) > len(slots):
            notes.append(f"{len(slots)} node(s): the first {len(slots)} of the {len(opts.hosts)} hosts given")
        if uses_torchrun(spec):
            notes.append(f"torchrun {opts.rendezvous} rendezvous at {master_addr(opts)}:{master_port(spec, opts)}")
        return Plan(
            backend=self.name,
            files={SCRIPT_NAME: node_script(spec, opts)},
            stored=({SCRIPT_NAME: node_script(dataclasses.replace(spec, env=redact_env(spec.env)), opts)}
                    if secret_values(spec.env) else {}),
            commands=[run_argv(opts, s) for s in slots],
            expected_hosts=[s.label for s in slots],
            notes=notes,
        )

    # -- I/O

    def check_ready(self, plan: Plan, spec: JobSpec) -> None:
        """The preflight: every host reachable and able to run the job, else InputError (exit 2), nothing started."""
        opts = SshOptions.from_dict(spec.options)
        preflight(spec, opts, layout(spec, opts))
        self._ready.add((spec.run_id, plan.files[SCRIPT_NAME]))

    def submit(self, plan: Plan, spec: JobSpec, workdir: Path) -> Submission:
        """Start the plan's ssh commands (in a window of ``max_connections``), after the preflight if not yet done.

        Each host's output is streamed with its prefix and kept in ``workdir/LABEL.log``.
        """
        opts = SshOptions.from_dict(spec.options)
        slots = layout(spec, opts)
        if (spec.run_id, plan.files[SCRIPT_NAME]) not in self._ready:
            preflight(spec, opts, slots)
        log_dir = Path(workdir)
        log_dir.mkdir(parents=True, exist_ok=True)
        run_dir = remote_run_dir(spec, opts)
        nodes = [HostRun(slot, argv) for slot, argv in zip(slots, plan.commands, strict=True)]
        kill_argvs = {s.label: ssh_argv(opts, s.host, kill_command(run_dir, s.dirname)) for s in slots}
        fail_fast = opts.fail_fast if opts.fail_fast is not None else uses_torchrun(spec)
        limit = spec.time_limit_min * 60.0 if spec.time_limit_min else None
        job = SshJob(nodes, plan.files[SCRIPT_NAME].encode(), opts, kill_argvs=kill_argvs,
                     stream=self.stream or sys.stdout, log_dir=log_dir, fail_fast=fail_fast, time_limit_s=limit)
        job.start()
        return Submission(backend=self.name, job_id=spec.run_id, handle=job, hosts=[s.label for s in slots])

    def poll(self, submission: Submission) -> JobState:
        return _job(submission).state()

    def cancel(self, submission: Submission) -> None:
        """Stop every host and wait (up to the kill grace plus the connect timeout) until the ssh sessions end."""
        job = _job(submission)
        job.stop("cancelled")
        job.join_stopper(job.opts.connect_timeout_s + LOCAL_GRACE_S + 30)
        job.wait(5)

    def logs(self, submission: Submission) -> str:
        return _job(submission).failed_tails()

    def gather(self, submission: Submission, spec: JobSpec) -> list[NodeReport]:
        """scp each host's node directory back and read its reports, attributed to the host label.

        A host whose directory cannot be fetched or read is left out (the
        cluster report lists it as missing); the reason is printed with its prefix.
        """
        job = _job(submission)
        opts = job.opts
        local_run = Path(spec.run_results_dir)
        local_run.mkdir(parents=True, exist_ok=True)
        run_dir = remote_run_dir(spec, opts)
        stream = self.stream or sys.stdout

        def fetch(node: HostRun) -> list[NodeReport]:
            slot = node.slot
            part = local_run / f".{slot.dirname}.part"
            shutil.rmtree(part, ignore_errors=True)
            argv = scp_argv(opts, slot.host, scp_path(f"{run_dir}/{slot.dirname}"), str(part))
            try:
                res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                     timeout=opts.connect_timeout_s + 300)
            except (subprocess.TimeoutExpired, OSError) as exc:
                _say(stream, slot.label, f"no reports fetched: {exc}")
                return []
            if res.returncode != 0 or not part.is_dir():
                why = " ".join(res.stderr.strip().splitlines()[-1:]) or f"scp exited with {res.returncode}"
                _say(stream, slot.label, f"no reports fetched: {why}")
                shutil.rmtree(part, ignore_errors=True)
                return []
            (part / "job.pid").unlink(missing_ok=True)
            final = local_run / slot.dirname
            shutil.rmtree(final, ignore_errors=True)
            part.rename(final)
            try:
                reports = read_reports(final)
            except InputError as exc:
                _say(stream, slot.label, f"unreadable report: {exc}")
                return []
            for report in reports:
                report.host = slot.label
            return reports

        started = [n for n in job.nodes if n.state == "done"]
        out: list[NodeReport] = []
        for reports in parallel(fetch, started, opts.max_connections):
            out.extend(reports)
        return out


def _say(stream: TextIO, label: str, text: str) -> None:
    with contextlib.suppress(ValueError, OSError):
        stream.write(f"[{label}] {text}\n")
        stream.flush()


def _job(submission: Submission) -> SshJob:
    if not isinstance(submission.handle, SshJob):
        raise TypeError("not an ssh submission")
    return submission.handle


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except OSError as exc:
        raise ConfigError(flag, path, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(flag, path, "not a text file") from None
