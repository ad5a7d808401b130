#!/usr/bin/env bash
# The project's GPU check for one lent H100/H200 (about 6 min): versions, the warm process's fork safety, every
# test file with a `gpu` mark, the stress check as shipped beside an nvidia-smi clock log, the quick suite, and the
# standard profile's fabric/p2p/reference_train/rdma. Everything lands in $OUT (at most 8 files come back).
#
# Prepare on the development machine, in the project root (the GPU image has torch, pyyaml, rich, numpy,
# nvidia-ml-py, pytest; not jsonschema):
#   echo /.devcheck/ >> .git/info/exclude; mkdir -p .devcheck/whl
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .devcheck/whl \
#     jsonschema jsonschema-specifications referencing rpds-py attrs pytest-timeout
# then run `bash bench/gpu_check.sh` there with .devcheck carried; record the figures in bench/RESULTS.md.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-$(mktemp -d)}  # never a fixed path in a shared /tmp
W=$(mktemp -d)
mkdir -p "$O" "$W/r-quick" "$W/r-std" "$W/r-stress"
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$O/env.txt"; }

# 0 wheels the image lacks (never over what it has), and gpuaccept importable from every process
python3 -c 'import attrs' 2>/dev/null && rm -f .devcheck/whl/attrs-*.whl
python3 -c 'import pytest_timeout' 2>/dev/null && rm -f .devcheck/whl/pytest_timeout-*.whl
if compgen -G '.devcheck/whl/*.whl' > /dev/null; then
  python3 -m pip install -q --no-index --no-deps .devcheck/whl/*.whl > "$O/env.txt" 2>&1
fi
echo "$PWD/src" > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/gpuaccept-src.pth"

# 1 (10 s) what ran: GPU, driver, torch/CUDA/NCCL/Triton, Python, compiler, CPUs, memory
{
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv
  python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), triton.__version__)'
  python3 --version; gcc --version | head -1; nproc; free -g | head -2
} >> "$O/env.txt" 2>&1

# 2 (<= 90 s) fork safety of the warm process: after its imports CUDA is untouched, and a forked child runs a
#   kernel, torch.compile and a 1-rank NCCL group; control: after torch.cuda.is_available() in the parent, a forked
#   child must fail "Cannot re-initialize CUDA"
stamp "fork"
timeout 90 python3 - > "$O/fork.txt" 2>&1 <<'PY'
import os
import time

import torch

from gpuaccept.node.zygote import preload

t = time.time()
print("preload failed:", preload())
import torch._dynamo  # noqa: E402,F401

print(f"preload {time.time() - t:.1f} s")
print("parent initialized:", torch.cuda.is_initialized(), "bad fork:", torch._C._cuda_isInBadFork())


def run(poisoned: bool) -> None:
    t = time.time()
    pid = os.fork()
    if pid == 0:
        try:
            assert float((torch.ones(4, device="cuda") * 2 + 1).sum()) == 12
            if not poisoned:
                f = torch.compile(lambda a: torch.rsqrt(a * a + 1).sum(1))
                f(torch.rand(256, 256, device="cuda"))
                import torch.distributed as dist
                dist.init_process_group("nccl", store=dist.TCPStore("127.0.0.1", 0, 1, True), rank=0,
                                        world_size=1, device_id=torch.device("cuda", 0))
                x = torch.ones(8, device="cuda")
                dist.all_reduce(x)
                dist.barrier()
                dist.destroy_process_group()
            print(f"child poisoned={poisoned}: ok", flush=True)
            os._exit(0)
        except BaseException as e:
            print(f"child poisoned={poisoned}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            os._exit(1)
    print("exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), f"{time.time() - t:.1f} s", flush=True)


run(False)
torch.cuda.is_available()
run(True)  # expected: exit 0, then exit 1 with the re-initialize error
PY

# 3 (<= 220 s) every test file with a gpu mark (the list follows the marks; test_agreement first: its
#   CUBLAS_WORKSPACE_CONFIG must precede any GEMM of the session)
stamp "pytest"
mapfile -t FILES < <(grep -lE 'mark\.gpu|pytestmark.*gpu' tests/test_*.py | sort)
timeout 220 python3 -m pytest -m gpu -q -rA -p no:cacheprovider --timeout 170 --durations 15 \
  --junitxml="$O/gpu-tests.xml" "${FILES[@]}" > "$O/pytest.txt" 2>&1
echo "pytest rc=$?" >> "$O/pytest.txt"

# 4 (<= 75 s) stress as shipped (full: bf16 N=8192, 30 s) with the SM clock, power and throttle reasons beside it
stamp "stress"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 250 > "$O/clocks.csv" 2>&1 &
SMI=$!
timeout 75 python3 -m gpuaccept run --device cuda --profile full --checks stress --report-dir "$W/r-stress" \
  --no-history > "$W/r-stress/console.txt" 2>&1
echo "stress rc=$?" >> "$W/r-stress/console.txt"
kill "$SMI" 2>/dev/null

# 5 (<= 70 s) the quick suite end to end through the warm process
stamp "quick"
timeout 70 python3 -m gpuaccept run --device cuda --require-gpu --profile quick --report-dir "$W/r-quick" \
  --no-history -v > "$W/r-quick/console.txt" 2>&1
echo "quick rc=$?" >> "$W/r-quick/console.txt"

# 6 (<= 60 s) the standard profile's checks the quick one leaves out that need no second GPU or node
stamp "standard part"
timeout 60 python3 -m gpuaccept run --device cuda --require-gpu --profile standard \
  --checks fabric,p2p,reference_train,rdma --report-dir "$W/r-std" --no-history -v > "$W/r-std/console.txt" 2>&1
echo "standard rc=$?" >> "$W/r-std/console.txt"
stamp "done"

tar czf "$O/runs.tgz" -C "$W" r-quick r-stress r-std 2>/dev/null
grep -h "exit\|child\|parent\|failed\|preload" "$O/fork.txt"
tail -4 "$O/pytest.txt"
tail -3 "$W/r-stress/console.txt"
tail -16 "$W/r-quick/console.txt"
tail -8 "$W/r-std/console.txt"
echo "everything is in $O"
