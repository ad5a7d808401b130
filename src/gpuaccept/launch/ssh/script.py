"""The node script: the POSIX sh program every host reads on standard input (pure, shellcheck-clean)."""

from __future__ import annotations

import shlex

from gpuaccept.launch.spec import JobSpec
from gpuaccept.launch.ssh.options import SshOptions
from gpuaccept.launch.ssh.plan import (
    KILL_GRACE_S,
    SCRIPT_NAME,
    SETUP_FAILED,
    master_addr,
    master_port,
    remote_run_dir,
    sh_path,
    uses_torchrun,
)


class _Var(str):
    """A shell variable reference in an argv (written as ``"$name"``, not quoted literally)."""


def _sh_word(word: str) -> str:
    if isinstance(word, _Var):
        return f'"${word}"' if word.isidentifier() else f'"{word}"'
    return shlex.quote(word)


def _sh_words(words: list[str], indent: str = "        ") -> str:
    """``set --`` arguments, several per line, continued with backslashes."""
    lines: list[str] = []
    current = ""
    for w in words:
        piece = _sh_word(w)
        if current and len(current) + len(piece) > 88:
            lines.append(current)
            current = piece
        else:
            current = f"{current} {piece}" if current else piece
    lines.append(current)
    return (" \\\n" + indent).join(lines)


def job_words(spec: JobSpec, opts: SshOptions) -> list[str]:
    """The argv each host starts (shell variables: ``py``, ``node_rank``, ``nproc``, ``node_dir``)."""
    py = _Var("py")
    if spec.command is None:
        suite = spec.suite_argv()
        job: list[str] = [py, "-m", "gpuaccept", *suite[1:]]
        idx = len(job) - 1 - job[::-1].index("--report-dir")
        job[idx + 1] = _Var("node_dir")
    else:
        job = list(spec.command)
    if not uses_torchrun(spec):
        return job
    words = [py, "-m", "torch.distributed.run", f"--nnodes={spec.nodes}", _Var("--nproc-per-node=${nproc}")]
    endpoint = f"{master_addr(opts)}:{master_port(spec, opts)}"
    if opts.rendezvous == "static":
        words += [_Var("--node-rank=${node_rank}"), f"--master-addr={master_addr(opts)}",
                  f"--master-port={master_port(spec, opts)}"]
    else:
        words += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={spec.run_id}"]
    words.append("--max-restarts=0")
    # as torchrun_job: a .py script runs with the remote Python, anything else as a program
    return [*words, *(job if job[0].endswith(".py") else ["--no-python", *job])]


_SCRIPT = """\
#!/bin/sh
# gpuaccept ssh launcher: node script of job {name}, run {run_id}. Generated; do not edit.
# The launcher runs, for each host:  ssh HOST exec /bin/sh -s -- RANK LABEL DIR NPROC < {script}
# and keeps standard input open. When it ends (Ctrl-C, cancel, a lost connection), the job's
# process group gets TERM, then KILL after {grace} s.
{literal}
main() {{
    node_rank=$1
    host_label=$2
    node_dir={run_dir}/$3
    nproc=$4
    py={python}

    mkdir -p -- "$node_dir" || {{ echo "gpuaccept: cannot create $node_dir on $host_label" >&2; exit {setup}; }}
{count}{prelude}
    export GPUACCEPT_HOSTNAME="$host_label"
    export GPUACCEPT_RUN_ID={run_id_q}
    export NODE_RANK="$node_rank"
    export NPROC_PER_NODE="$nproc"
    export NNODES={nodes}
    export MASTER_ADDR={master_addr}
    export MASTER_PORT={master_port}

    set -- {words}

    exec 3<&0 </dev/null
    "$py" -c 'import os, sys; os.setsid(); os.execvp(sys.argv[1], sys.argv[1:])' "$@" 3<&- &
    job=$!
    echo "$job" > "$node_dir/job.pid"
    (
        while IFS= read -r _; do :; done
        stop_group "$job" "$job"
    ) <&3 >/dev/null 2>&1 &
    watchdog=$!
    exec 3<&-
    wait "$job"
    rc=$?
    kill "$watchdog" 2>/dev/null
    rm -f -- "$node_dir/job.pid"
    stop_group "$job"
    exit "$rc"
}}

# TERM the process group $1 (with $2 = pid: that process too, in case it had not yet left ours),
# then KILL what is left of the group after {grace} s. (kill -SIG -PGID: dash's kill takes no --.)
stop_group() {{
    kill -TERM "-$1" 2>/dev/null || {{ [ -n "${{2-}}" ] && kill -TERM "$2" 2>/dev/null; }} || return 0
    i=0
    while [ "$i" -lt {grace} ] && kill -0 "-$1" 2>/dev/null; do
        sleep 1
        i=$((i + 1))
    done
    kill -KILL "-$1" 2>/dev/null
    return 0
}}

main "$@"
"""


def node_script(spec: JobSpec, opts: SshOptions) -> str:
    """The POSIX sh script every host runs (pure, shellcheck-clean).

    Values are single-quoted, so any byte but NUL survives.
    """
    python = opts.remote_python or spec.python
    cd = ""
    if spec.workdir:
        wd = shlex.quote(spec.workdir)
        cd = f'    cd -- {wd} || {{ echo "gpuaccept: no working directory {_dq(spec.workdir)} on $host_label" >&2; ' \
             f"exit {SETUP_FAILED}; }}"
    env = "\n".join(f"    export {k}={shlex.quote(v)}" for k, v in spec.env.items())
    words = job_words(spec, opts)
    literals = [*spec.env.values(), *(w for w in words if not isinstance(w, _Var)), spec.workdir or ""]
    literal = ("# shellcheck disable=SC2016  # $ and ` in single quotes are meant literally\n"
               if any(c in v for v in literals for c in "$`") else "")
    return _SCRIPT.format(
        literal=literal,
        name=_comment(spec.name), run_id=_comment(spec.run_id), script=SCRIPT_NAME, grace=KILL_GRACE_S,
        run_dir=sh_path(remote_run_dir(spec, opts)), python=shlex.quote(python), setup=SETUP_FAILED,
        count=_count_block() if spec.nproc is None and uses_torchrun(spec) else "",
        prelude="".join(f"{block}\n\n" for block in (cd, env) if block), run_id_q=shlex.quote(spec.run_id),
        nodes=spec.nodes,
        master_addr=shlex.quote(master_addr(opts)), master_port=master_port(spec, opts),
        words=_sh_words(words),
    ).replace("\n\n\n", "\n\n")


def _count_block() -> str:
    """Lines of ``main`` that replace NPROC ``gpu`` with the host's GPU count (or stop: no GPU)."""
    from gpuaccept.launch.gpucount import count_lines

    body = "\n".join(f"        {line}" if line else "" for line in count_lines("nproc", "$host_label"))
    return f'    # NPROC gpu (no --gpus-per-node): one rank per GPU this host has, counted here.\n' \
        f'    if [ "$nproc" = gpu ]; then\n{body}\n    fi\n'


def _comment(text: str) -> str:
    return " ".join(text.split())


def _dq(text: str) -> str:
    """``text`` inside a double-quoted shell string, printed literally."""
    return "".join("\\" + c if c in '"$`\\' else c for c in text.replace("\n", " "))
