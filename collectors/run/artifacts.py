"""A run's logs (and nsys/ncu reports) into its artifacts when it ends, wherever its experiment keeps them.

The upload is the one last write that may go to another service than the store (an `mlflow server`'s
proxied artifacts, a bucket, a shared folder): when it fails, the run still gets its status and tags,
and its logs stay in the run's folder, where `radt sync` finds them (pending.json) and uploads them again.
"""

from __future__ import annotations

from pathlib import Path

from radt.collectors._common import first_line
from radt.rundir import LOGS_DIR
from radt.settings import display_uri


def attach_logs(client, run_dir: Path, run_id: str, node: str | None = None) -> str | None:
    """The run folder's logs/ under the run's radt/ artifacts (radt/<node> for a node's part); None when attached or empty.

    After a failed upload, what failed, for the caller's one line (it keeps the run's last writes for `radt sync`
    where its disk lets it). The store's own failure (reading the run) is raised: the caller keeps the whole run for `radt sync`."""
    logs = run_dir / LOGS_DIR
    if not logs.is_dir() or not any(logs.iterdir()):
        return None
    location = client.get_run(run_id).info.artifact_uri
    try:
        client.log_artifacts(run_id, str(logs), artifact_path=f"radt/{node}" if node else "radt")
    except Exception as exc:  # the artifact store refused or is away: any error of any of MLflow's repositories
        return f"could not upload the logs of run {run_id} to {display_uri(location or '')} ({first_line(exc, 200)})"
    return None
