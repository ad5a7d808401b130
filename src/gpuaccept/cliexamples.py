"""The grouped command list and the examples of every ``--help`` (data; :func:`attach` puts them in the parsers'
epilogs, so that a reference generated from the parser has them too)."""

from __future__ import annotations

import argparse

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("node", ("run", "checks", "conformance", "nccl-tests")),
    ("cluster", ("launch", "gather", "isolate", "rdma")),
    ("results", ("report", "history", "compare", "trend", "analyze", "baseline", "serve-metrics")),
    ("health", ("healthcheck", "node-status", "sweep")),
    ("containers", ("image", "sshd-config", "constraints")),
    ("shell", ("completion",)),
)
"""The top-level commands by what they work on, in the order ``gpuaccept --help`` lists them."""

_L = "gpuaccept launch"
EXAMPLES: dict[str, tuple[str, ...]] = {
    "": ("gpuaccept run --profile quick", "gpuaccept launch slurm --nodes 4 --partition gpu --budget 30m",
         "gpuaccept report 20261120T080000Z-gpu01 --format md -o -"),
    "run": ("gpuaccept run --profile quick", "gpuaccept run --budget 10m --plan",
            "gpuaccept run --checks compute,memory --json report.json"),
    "checks": ("gpuaccept checks", "gpuaccept checks --profile full --json"),
    "history": ("gpuaccept history --host gpu01 --since 7d", "gpuaccept history --import gpuaccept-reports/*/",
                "gpuaccept history --gpu GPU-1a2b3c4d-0000-0000-0000-000000000000 --json"),
    "compare": ("gpuaccept compare 20261101T080000Z-gpu01 20261120T080000Z-gpu01",
                "gpuaccept compare before/report.json after/report.json --check compute --json"),
    "trend": ("gpuaccept trend --host gpu01 --metric gemm_bf16_tflops",
              "gpuaccept trend --host gpu01 --metric hbm_bw_gbs --since 30d --max-z 4 --no-exit-code"),
    "launch": (f"{_L} slurm --nodes 4 --partition gpu --time 1h", f"{_L} k8s --nodes 2 --image IMG --dry-run",
               f"{_L} local --nodes 2 --device cpu --profile quick"),
    "launch slurm": (f"{_L} slurm --nodes 4 --partition gpu --time 01:00:00 --budget 30m",
                     f"{_L} slurm --nodes 2 --image nvcr.io/nvidia/pytorch:24.10-py3 --dry-run",
                     f"{_L} slurm --nodes 2 --no-torchrun -- nvidia-smi -L"),
    "launch ssh": (f"{_L} ssh --hosts gpu01,gpu02 --profile quick",
                   f"{_L} ssh --hosts gpu01,gpu02,admin@gpu03:2222 --dry-run"),
    "launch k8s": (f"{_L} k8s --nodes 2 --image ghcr.io/example/gpuaccept:1.0 --dry-run",
                   f"{_L} k8s --nodes 4 --image ghcr.io/example/gpuaccept:1.0 --time 2h --detach"),
    "launch runai": (f"{_L} runai --nodes 2 --image ghcr.io/example/gpuaccept:1.0 --project team-a --dry-run",
                     f"{_L} runai --nodes 4 --image ghcr.io/example/gpuaccept:1.0 --time 1h --detach"),
    "launch bcp": (f"{_L} bcp --nodes 2 --image nvcr.io/org/gpuaccept:1.0 --instance dgxa100.80g.8.norm --time 1h "
                   "--dry-run",
                   f"{_L} bcp --image nvcr.io/org/gpuaccept:1.0 --instance dgxa100.80g.8.norm --profile quick"),
    "launch mpi": (f"{_L} mpi --hosts gpu01,gpu02 --profile quick", f"{_L} mpi --hosts gpu01,gpu02 --dry-run"),
    "launch local": (f"{_L} local --nodes 2 --device cpu --profile quick", f"{_L} local --nodes 2 --plan"),
    "gather": ("gpuaccept gather gpuaccept-reports/20261120T080000Z-accept-1a2b",
               "gpuaccept gather /shared/reports/RUN_ID --cluster-report cluster.json"),
    "baseline": ("gpuaccept baseline create --from reports/ -o baseline.yaml", "gpuaccept baseline show baseline.yaml",
                 "gpuaccept baseline apply report.json --baseline baseline.yaml"),
    "baseline create": ("gpuaccept baseline create --from reports/ -o baseline.yaml",
                        "gpuaccept baseline create --history --since 30d --max-z 3 -o baseline.yaml"),
    "baseline show": ("gpuaccept baseline show baseline.yaml",
                      "gpuaccept baseline show baseline.yaml --sku H100 --json"),
    "baseline apply": ("gpuaccept baseline apply report.json --baseline baseline.yaml",
                       "gpuaccept baseline apply cluster-report.json --baseline baseline.yaml -o judged.json"),
    "analyze": ("gpuaccept analyze gpuaccept-reports/RUN_ID/cluster-report.json",
                "gpuaccept analyze reports/ --max-z 4 --exit-code --json"),
    "report": ("gpuaccept report 20261120T080000Z-gpu01",
               "gpuaccept report RUN_ID --format junit -o results.xml --exit-code"),
    "serve-metrics": ("gpuaccept serve-metrics --report-dir /shared/gpuaccept-reports --port 9400",
                      "gpuaccept serve-metrics --db sqlite:///var/lib/gpuaccept/history.db --max-age 7d"),
    "sshd-config": ("gpuaccept sshd-config --dir $HOME/.gpuaccept-sshd --port 2222 --hosts gpu01,gpu02",
                    "gpuaccept sshd-config --dir ./sshd --port 2222 --hosts 'gpu*' --listen 10.0.0.5"),
    "image": ("gpuaccept image build runtime --tag gpuaccept:dev --load",
              "gpuaccept image build multinode --platform linux/amd64,linux/arm64 --push --tag REG/gpuaccept:1.0"),
    "image build": ("gpuaccept image build runtime --tag gpuaccept:dev --load",
                    "gpuaccept image build multinode --tag REG/gpuaccept:1.0 --push --dry-run"),
    "conformance": ("gpuaccept conformance capture -o site-manifest.yaml",
                    "gpuaccept conformance check site-manifest.yaml",
                    "gpuaccept conformance diff last-pass/report.json today/report.json",
                    "gpuaccept conformance changes gpu07"),
    "conformance capture": ("gpuaccept conformance capture -o site-manifest.yaml",
                            "gpuaccept conformance capture --from gpuaccept-reports/20261120T080000Z-gpu01 -o m.yaml"),
    "conformance check": ("gpuaccept conformance check site-manifest.yaml",
                          "gpuaccept conformance check /etc/gpuaccept/manifest.yaml"),
    "conformance diff": ("gpuaccept conformance diff last-pass/report.json today/report.json",
                         "gpuaccept conformance diff gpuaccept-reports/RUN_A gpuaccept-reports/RUN_B"),
    "conformance changes": ("gpuaccept conformance changes gpu07",
                            "gpuaccept conformance changes gpu07 --since 2026-11-01 --json",
                            "gpuaccept conformance changes gpu07 --since 20261120T080000Z-gpu07-ab12 "
                            "--db postgresql://gpuaccept@db.example.com/gpuaccept"),
    "nccl-tests": ("gpuaccept nccl-tests all_reduce -- -b 8M -e 8G -f 2",
                   "mpirun -np 16 all_reduce_perf -b 8M -e 8G -f 2 -g 1 | gpuaccept nccl-tests parse -"),
    "nccl-tests run": ("gpuaccept nccl-tests run all_reduce all_gather --min-busbw 300",
                       "gpuaccept nccl-tests run all_reduce --timeout 10m -- -b 1G -e 8G"),
    "rdma": ("gpuaccept rdma parse client.txt --port mlx5_0:1",
             "gpuaccept rdma plan --nodes node-a,node-b --nics mlx5_0,mlx5_1 --gpus"),
    "rdma parse": ("gpuaccept rdma parse client.txt --port mlx5_0:1",
                   "ib_write_bw -d mlx5_0 --report_gbits node-a 2>&1 | gpuaccept rdma parse - --rate-gbps 400",
                   "gpuaccept rdma parse server.txt --min-gbps 380 --client node-b --server node-a --json"),
    "rdma plan": ("gpuaccept rdma plan --nodes node-a,node-b --nics mlx5_0,mlx5_1,mlx5_2,mlx5_3 --gpus",
                  "gpuaccept rdma plan --nodes node-c,node-d --nics mlx5_0,mlx5_1 --pair-index 1 --json"),
    "rdma pair-node": ("gpuaccept launch mpi --nodes 2 --hosts node-a,node-b --procs-per-node 1 -- python3 -m "
                       "gpuaccept rdma pair-node --nodes node-a,node-b --nics mlx5_0,mlx5_1",
                       "gpuaccept rdma pair-node --nodes node-a,node-b --nics mlx5_0 --rank 0 --memory host"),
    "nccl-tests parse": ("gpuaccept nccl-tests parse all_reduce.log",
                         "gpuaccept nccl-tests parse run.json --nvml-snapshot node.json --json"),
    "isolate": ("gpuaccept isolate --backend slurm --nodes gpu[01-16] --dry-run",
                "gpuaccept isolate --backend local --nodes 4 --device cpu --json verdicts.json"),
    "constraints": ("gpuaccept constraints -o constraints.txt", "gpuaccept constraints --urls -o -"),
    "healthcheck": ("gpuaccept healthcheck --deadline 45s", "gpuaccept healthcheck --budget 2m --slurm drain",
                    "gpuaccept healthcheck --mode prolog --slurm print",
                    "gpuaccept healthcheck --slurm drain --breaker-limit 2 --breaker-window 1h"),
    "sweep": ("gpuaccept sweep slurm --partition gpu --qos scavenger --report-dir /shared/sweeps "
              "--db postgresql://gpuaccept@db/gpuaccept",
              "gpuaccept sweep flag --db postgresql://gpuaccept@db/gpuaccept --since 30d"),
    "sweep slurm": ("gpuaccept sweep slurm --partition gpu --qos scavenger --report-dir /shared/sweeps --dry-run",
                    "gpuaccept sweep slurm --partition gpu --report-dir /shared/sweeps --max-nodes 8 --time 20m "
                    "--db postgresql://gpuaccept@db/gpuaccept -- --checks env,health,compute"),
    "sweep flag": ("gpuaccept sweep flag --db postgresql://gpuaccept@db/gpuaccept --since 30d",
                   "gpuaccept sweep flag --metric gemm_bf16_tflops --metric hbm_bw_gbs --json"),
    "sweep k8s": ("gpuaccept sweep k8s --image ghcr.io/example/gpuaccept:1.0 --db-secret gpuaccept-db --nodes 8",
                  "gpuaccept sweep k8s --image ghcr.io/example/gpuaccept:1.0 --schedule '*/30 * * * *' "
                  "--node-selector nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"),
    "node-status": ("gpuaccept node-status label --report gpuaccept-reports/RUN_ID --apply --taint",
                    "gpuaccept node-status daemonset --image ghcr.io/example/gpuaccept:1.0 --profile quick --taint",
                    "gpuaccept node-status npd npd/ --profile quick"),
    "node-status label": ("gpuaccept node-status label --profile quick --node gpu-07",
                          "gpuaccept node-status label --report gpuaccept-reports/RUN_ID --apply --taint",
                          "gpuaccept node-status label --profile quick --plan"),
    "node-status daemonset": ("gpuaccept node-status daemonset --image ghcr.io/example/gpuaccept:1.0 --profile quick "
                              "--taint",
                              "gpuaccept node-status daemonset --image ghcr.io/example/gpuaccept:1.0 --profile "
                              "standard --interval 1h --node-selector nvidia.com/gpu.present=true"),
    "node-status npd": ("gpuaccept node-status npd npd/ --profile quick",
                        "gpuaccept node-status npd npd/ --report /var/lib/gpuaccept/latest --invoke-interval 1h"),
    "completion": ("gpuaccept completion bash > /etc/bash_completion.d/gpuaccept",
                   "gpuaccept completion zsh > \"${fpath[1]}/_gpuaccept\""),
}
"""Two or three real command lines per command (``""``: ``gpuaccept`` itself)."""


def epilog(where: str) -> str:
    """``examples:`` and the command lines of ``where``."""
    return "examples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[where])


def command_list(commands: dict[str, str]) -> str:
    """The top-level commands (name -> one-line help) under the headings of :data:`GROUPS`."""
    width = max(map(len, commands)) + 2
    parts = []
    for group, names in GROUPS:
        rows = [f"  {n:<{width}}{commands[n]}" for n in names if n in commands]
        if rows:
            parts.append(f"{group}:\n" + "\n".join(rows))
    return "\n\n".join(parts)


def attach(walk: list[tuple[str, argparse.ArgumentParser]]) -> None:
    """Set each parser's epilog from :data:`EXAMPLES` (the top parser's: the grouped commands too)."""
    for where, p in walk:
        if where in EXAMPLES:
            p.epilog = epilog(where)
