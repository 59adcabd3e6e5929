#!/usr/bin/env bash
# Checks radt on a lent GPU machine (no network there, PyTorch preinstalled): the hardware check of
# docs/GPU.md, then `radt monitor` with its Prometheus /metrics on the real GPU. Run from the repository
# root with radt's runtime wheels in .whl/ (docs/GPU.md says which) and OUT set to a folder to keep.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to the folder that keeps the results}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
# The raw checkout as the installed package: radt.app, radt.collectors, ... are its top-level folders.
for d in app collectors pages assets; do ln -sfn ../$d radt/$d; done
git log -1 --format='radt at %h %s' 2>/dev/null | cut -c1-100
python3 -c "import torch, pynvml, prometheus_client; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

timeout 330 python3 bench/gpu_check.py run --out "$OUT/gc" 2>&1 | tee "$OUT/gpu-check.txt"

# radt monitor on the same GPU: a run of the monitor experiment, and /metrics while it samples.
{
  python3 -m radt monitor --store "sqlite:////tmp/monitor.db" --interval 0.5 --rollover never --prometheus-port 9471 &
  pid=$!
  python3 - <<'EOF'
import time, urllib.request
deadline = time.time() + 30
while time.time() < deadline:
    try:
        body = urllib.request.urlopen("http://127.0.0.1:9471/metrics", timeout=2).read().decode()
        if "gpu" in body:
            break
    except OSError:
        pass
    time.sleep(0.5)
time.sleep(3)
body = urllib.request.urlopen("http://127.0.0.1:9471/metrics", timeout=2).read().decode()
print("\n".join(line for line in body.splitlines() if not line.startswith("#"))[:6000])
EOF
  kill -INT $pid
  wait $pid
  echo "monitor exit $?"
  python3 - <<'EOF'
import sqlite3
db = sqlite3.connect("/tmp/monitor.db")
for row in db.execute("select run_uuid, status, start_time, end_time from runs"):
    print("run", row)
for row in db.execute("select key, count(*), min(value), max(value) from metrics group by key order by key"):
    print(row)
EOF
} 2>&1 | tee "$OUT/monitor.txt"

# ncu wrapping a real PyTorch script: `-l ...+ncu` captures only the NVTX range 'profile' that radt.run() opens,
# so the 40 warm-up products before the block must be absent from the report and the 6 inside it present;
# `ncu-raw` captures from the start. NVML's GPM samples beside ncu (both read the profiling counters).
{
  command -v ncu || export PATH="$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | tail -1)"
  ncu --version | tail -1
  cat > /tmp/ncu_train.py <<'PY'
import radt, torch
x = torch.randn(2048, 2048, device="cuda")
for _ in range(40):
    x.mul_(1.0)  # warm-up outside the range: elementwise kernels ncu must not capture
torch.cuda.synchronize()
with radt.run() as run:
    for step in range(6):
        y = x @ x  # one GEMM kernel each, inside the NVTX range 'profile'
        run.log_metric("step", step)
    torch.cuda.synchronize()
print("script done")
PY
  for listener in ncu ncu-raw; do
    echo "== radt -l nvml+host+$listener"
    mkdir -p /tmp/art-$listener; RADT_ARTIFACT_URI=/tmp/art-$listener timeout 150 python3 -m radt -e "$listener-check" -d 0 -l "nvml+host+$listener" --interval 0.5 \
      --store "sqlite:////tmp/$listener.db" /tmp/ncu_train.py
    echo "radt exit $?"
    for rep in $(find /tmp/art-$listener -name '*.ncu-rep'); do
      ls -l "$rep"; cp "$rep" "$OUT/$listener.ncu-rep"
      ncu -i "$rep" --csv --page raw --metrics gpu__time_duration.sum > /tmp/kernels.csv 2>&1
      python3 - <<'PY'
import collections, csv
rows = [r for r in csv.DictReader(open("/tmp/kernels.csv")) if r.get("ID", "").isdigit()]
print("kernels:", len(rows), "| by name:", collections.Counter(r["Kernel Name"][:60] for r in rows).most_common(6))
PY
      head -c 600 /tmp/kernels.csv; echo
    done
    python3 - "$listener" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"/tmp/{sys.argv[1]}.db")
print([r for r in db.execute("select status, end_time - start_time from runs")])
for row in db.execute("select key, count(*), round(max(value), 3) from metrics where key like '%sm_active' or key like '%utilization%' or key = 'step' group by key"):
    print(row)
PY
  done
} 2>&1 | tee "$OUT/ncu.txt"
# at most 8 files come back from the lent machine: the check's folder travels as one archive
tar czf "$OUT/gc.tgz" -C "$OUT" gc && rm -rf "$OUT/gc"
