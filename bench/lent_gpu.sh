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
