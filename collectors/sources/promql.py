"""Read GPU exporters' series from a Prometheus server's HTTP API and name them with catalogue keys.

dcgm-exporter publishes one series per GPU (labels `gpu`, `UUID`, `device`, `modelName`, `Hostname`; newer
exporters spell it `hostname`, so both are tried) and per MIG slice (`GPU_I_ID`, `GPU_I_PROFILE` besides); Prometheus adds `job` and `instance`.
An NVML/GPM exporter with the same labels is read too: `radt monitor --prometheus-port` (radt_sm_active, ...). So is
the NVML exporter of Princeton's jobstats (nvidia_gpu_*: the GPU by `ordinal`, NVML's index, else `minor_number`, its
`uuid`; the node only by its scrape target, `instance` node:9445), and its cgroup exporter's series of a Slurm job
(cgroup_*{jobid}). Where a node runs two, dcgm-exporter's series is the one kept (catalogue.EXPORTER_FAMILIES' order).
The values are read raw (a range selector, `metric[30s]`), with the scrape's own timestamps, so
nothing is resampled, repeated by the lookback window or dropped between steps as `query_range` would.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import requests

from radt.catalogue import (
    CGROUP_EXPORTER_METRICS,
    CLOCK_REASON_BITS,
    DCGM_CLOCK_REASON_TAGS,
    DCGM_EXPORTER_METRICS,
    DCGM_EXPORTER_NAMES,
    DCGM_EXPORTER_POD_DETAIL_LABELS,
    DCGM_EXPORTER_POD_LABELS,
    DCGM_EXPORTER_POD_SHARES,
    DCGM_EXPORTER_TAGS,
    EXPORTER_COUNTERS,
    EXPORTER_FAMILIES,
    EXPORTER_METRICS,
    clock_reason_series,
    key,
)
from radt.collectors.sources.gpus import OLD_MIG
from radt.errors import UserError
from radt.settings import LABEL_NAME, PROMETHEUS_HOST_LABEL, is_http_url, prometheus_pod

# the node's label, tried in turn: dcgm-exporter's Hostname, newer exporters' hostname; "instance" matches the scrape target instead
DEFAULT_HOST_LABELS: tuple[str, ...] = tuple(PROMETHEUS_HOST_LABEL.default.split(","))
DEFAULT_HOST_LABEL = DEFAULT_HOST_LABELS[0]
TIMEOUT = 5.0  # seconds for one HTTP call
CHUNK_S = 3600  # seconds of raw samples asked for in one backfill query


class PromUrlError(UserError, ValueError):
    """A Prometheus URL or label name the user gave is malformed; the message names the option and the fix (a ValueError
    still, for the callers that catch it with the other bad values)."""


def check_url(text: str, source: str = "--prometheus") -> str:
    """A Prometheus server's base URL without its trailing slash; PromUrlError in one line naming the fix."""
    url = text.strip().rstrip("/")
    if not is_http_url(url):  # also 'http://[::1' and 'http://host:99999', which the HTTP client raises on
        raise PromUrlError(f"{source} '{text}' is not a Prometheus server's http(s) URL; give e.g. {source} http://prometheus:9090")
    return url


def check_label(name: str, source: str = "RADT_PROMETHEUS_HOST_LABEL") -> str:
    """A Prometheus label name (Hostname, instance, node); PromUrlError in one line naming the fix."""
    if not LABEL_NAME.fullmatch(name):
        raise PromUrlError(f"{source}={name!r} is not a Prometheus label name; give the exporter's node label, e.g. Hostname or instance")
    return name


def host_labels(text: str, source: str = "RADT_PROMETHEUS_HOST_LABEL") -> tuple[str, ...]:
    """'Hostname,hostname' -> the node labels tried in turn (empty: both spellings); PromUrlError in one line naming the fix."""
    names = tuple(check_label(name.strip(), source) for name in text.split(",") if name.strip())
    return names or DEFAULT_HOST_LABELS


def looked_for(host: str, labels: Iterable[str]) -> str:
    """The node as the "no series" lines name it: every label tried with the value looked for (Hostname=pod-7 or hostname=pod-7)."""
    return " or ".join(f"{label}={host}" for label in labels)


class PromError(Exception):
    """Prometheus did not answer (`kind` "unreachable") or refused the query ("refused"); the message says which."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Series(NamedTuple):
    labels: dict[str, str]
    samples: list[tuple[int, float]]  # (timestamp in ms, value), oldest first


_sessions = threading.local()  # one requests.Session per thread: a requests.Session is not meant to be shared across threads


def _session() -> requests.Session:
    """This thread's session, whose kept-alive connections the next query reuses (a tick a second: no new TCP per query)."""
    session = getattr(_sessions, "session", None)
    if session is None:
        session = _sessions.session = requests.Session()
    return session


def _cause(exc: BaseException) -> BaseException:
    """The innermost error under requests' and urllib3's wrappers: '[Errno 111] Connection refused', 'timed out'."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = exc.__cause__ or getattr(exc, "reason", None) or next((a for a in exc.args[:1] if isinstance(a, BaseException)), None)
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def _get(url: str, path: str, params: Mapping[str, str], timeout: float) -> Any:
    """One API call's `data`; PromError when the server is not there or says error."""
    try:
        response = _session().get(f"{url.rstrip('/')}{path}", params=params, timeout=timeout)
        if response.status_code >= 400:  # 400 bad query, 422 execution error, 503 overloaded: a JSON error body
            try:
                said = response.json().get("error") or response.reason
            except (ValueError, AttributeError):
                said = response.reason
            raise PromError("refused", f"Prometheus at {url} refused the query (HTTP {response.status_code}: {said})")
        body = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise PromError("unreachable", f"Prometheus at {url} did not answer ({_cause(exc)})") from None
    if body.get("status") != "success":
        raise PromError("refused", f"Prometheus at {url} refused the query ({body.get('errorType')}: {body.get('error')})")
    return body["data"]


def _value(text: str) -> float:
    return float(text)  # Prometheus writes NaN and +Inf as text, which float() reads


def query(url: str, promql: str, at: float | None = None, timeout: float = TIMEOUT) -> list[Series]:
    """An instant query; a range selector's answer (a matrix) keeps every raw sample."""
    params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
    data = _get(url, "/api/v1/query", params, timeout)
    if data["resultType"] == "matrix":
        return [Series(r["metric"], [(round(t * 1000), _value(v)) for t, v in r["values"]]) for r in data["result"]]
    if data["resultType"] == "vector":
        return [Series(r["metric"], [(round(r["value"][0] * 1000), _value(r["value"][1]))]) for r in data["result"]]
    return []


def label_values(url: str, label: str, match: str, start_ms: int | None = None, end_ms: int | None = None, timeout: float = TIMEOUT) -> list[str]:
    """The values `label` takes in the series `match` selects over [start_ms, end_ms] (all the server holds without them):
    Prometheus' index only, no sample read."""
    return list(_get(url, f"/api/v1/label/{label}/values", {"match[]": match} | _span(start_ms, end_ms), timeout))


def series(url: str, match: str, start_ms: int | None = None, end_ms: int | None = None, timeout: float = TIMEOUT) -> list[dict[str, str]]:
    """The label sets of the series `match` selects over [start_ms, end_ms]: Prometheus' index only, no sample read."""
    return list(_get(url, "/api/v1/series", {"match[]": match} | _span(start_ms, end_ms), timeout))


def _span(start_ms: int | None, end_ms: int | None) -> dict[str, str]:
    return ({"start": f"{start_ms / 1000:.3f}"} if start_ms is not None else {}) | ({"end": f"{end_ms / 1000:.3f}"} if end_ms is not None else {})


def query_range(url: str, promql: str, start: float, end: float, step: float, timeout: float = TIMEOUT) -> list[Series]:
    """`query_range` evaluated every `step` seconds (resampled: the last value within Prometheus' lookback)."""
    params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    data = _get(url, "/api/v1/query_range", params, timeout)
    return [Series(r["metric"], [(round(t * 1000), _value(v)) for t, v in r["values"]]) for r in data["result"]]


def string_literal(text: str) -> str:
    return json.dumps(text)  # a PromQL string literal: double quotes, backslash escapes


def selector(host: str | None, host_label: str = DEFAULT_HOST_LABEL, metrics: Iterable[str] = EXPORTER_METRICS, also: Iterable[str] = ()) -> str:
    """{__name__=~"DCGM_FI_...|...", Hostname="node-7"}; with host_label "instance", any port of that host; `also`: more matchers."""
    names = "|".join(re.escape(m) for m in metrics)
    matchers = [f"__name__=~{string_literal(names)}"]
    if host:
        matchers.append(host_matcher(host, host_label))
    return "{" + ", ".join([*matchers, *also]) + "}"


INSTANCE = "instance"  # the scrape target Prometheus labels every series with: node:port where targets are named by node


def host_matcher(host: str, host_label: str) -> str:
    """Hostname="node-7"; with host_label "instance", any port of that host (jobstats' node:9445)."""
    if host_label == INSTANCE:
        return f"instance=~{string_literal(re.escape(host) + '(:[0-9]+)?')}"
    return f"{host_label}={string_literal(host)}"


JOB_LABELS = ("jobid", "hpc_job")  # the Slurm job an exporter says uses a device (a prolog's mapping; dcgm-exporter's --hpc-job-mapping-dir)
JOBID = JOB_LABELS[0]  # jobstats' exporters' label (its NVML exporter's, from its prolog's /run/gpustat; its cgroup exporter's)
USER_LABELS = ("userid",)  # jobstats' NVML exporter names the job's user beside its jobid: still the device's one series
STEP_LABELS = ("step", "task")  # the cgroup exporter's cgroup of one step or task of a job; neither: the whole job's
# a series' GPU: dcgm-exporter's and radt's `gpu` (NVML's index), jobstats' `ordinal` (NVML's), else its `minor_number`
# (/dev/nvidia<N>, its only index before 2024); its UUID: dcgm-exporter's `UUID`, jobstats' `uuid`
GPU_INDEX_LABELS = ("gpu", "ordinal", "minor_number")
UUID_LABELS = ("UUID", "uuid")
# the Kubernetes pod dcgm-exporter says uses a device, and its other labels of it (exported_: renamed by a scrape of a pod)
POD_LABELS = (*DCGM_EXPORTER_POD_LABELS, *(f"exported_{name}" for name in DCGM_EXPORTER_POD_LABELS))
POD_DETAIL_LABELS = (*DCGM_EXPORTER_POD_DETAIL_LABELS, *(f"exported_{name}" for name in DCGM_EXPORTER_POD_DETAIL_LABELS))
ERROR_LABELS = ("err_code", "err_msg")  # newer dcgm-exporters label the XID series with its code: still the device's one series
XID_TAG = "XIDER"  # the XID field's dmon tag; its dcgm-exporter series holds the last XID (see _new_xids)


def gpu_index(labels: Mapping[str, str]) -> int | None:
    """A series' GPU by its exporter's index label (GPU_INDEX_LABELS, the first it has); None where it has none."""
    text = next((labels[name] for name in GPU_INDEX_LABELS if labels.get(name)), "")
    return int(text) if text.isdigit() else None


def series_uuid(labels: Mapping[str, str]) -> str:
    """A series' GPU or MIG device UUID (UUID_LABELS); '' where it has none."""
    return next((labels[name] for name in UUID_LABELS if labels.get(name)), "")


def duration(start_ms: int, end_ms: int) -> str:
    """A range selector's duration covering [start_ms, end_ms] whole, as evaluated at end_ms ('3600001ms'; at least 1 ms)."""
    return f"{max(1, end_ms - start_ms + 1)}ms"


def owners(environ: Mapping[str, str], pod: str | None = None) -> dict[str, str]:
    """The labels an exporter marks a device's user with, and this process's values: its Slurm job's id, its pod's name
    (`pod`, else settings.prometheus_pod: RADT_PROMETHEUS_POD, else in a pod its host name)."""
    found: dict[str, str] = {}
    job = environ.get("SLURM_JOB_ID", "").strip()
    if job:
        found |= dict.fromkeys(JOB_LABELS, job)
    pod = (pod if pod is not None else prometheus_pod(environ)).strip()
    if pod:
        found |= dict.fromkeys(POD_LABELS, pod)
    return found


def pod_of(labels: Mapping[str, str]) -> str:
    """The pod a series names (POD_LABELS, the first it has); '' for none: a device's own series."""
    return next((labels[name] for name in POD_LABELS if labels.get(name)), "")


class Wanted(NamedTuple):
    """Which of a node's series belong to the run: GPUs by NVML index (None: all), MIG slices, UUID -> NVML index; GPU-/MIG-
    UUIDs the run was given that NVML could not map (`given`), the labels that name the run's job or pod (`owners`), GPUs
    whose every slice is the run's (`mig_gpus`: `radt import --gpus 0` on a GPU in MIG mode)."""

    gpus: list[int] | None = None
    slices: tuple[tuple[int, int], ...] | list[tuple[int, int]] = ()  # (GPU, GPU instance id): the run's MIG slices, none besides
    uuids: Mapping[str, int] = {}
    given: tuple[str, ...] = ()
    owners: Mapping[str, str] = {}
    mig_gpus: tuple[int, ...] = ()

    def place(self, labels: Mapping[str, str]) -> tuple[int, int | None] | None:
        """(NVML index, GPU instance id or None) of a series the run watches; None for another GPU's, slice's, job's or pod's."""
        if any(labels.get(name) and labels[name] != value for name, value in self.owners.items()):
            return None  # the exporter says another Slurm job (or pod) uses it
        uuid, index = series_uuid(labels), gpu_index(labels)
        if uuid in self.uuids:
            gpu = self.uuids[uuid]
        elif index is not None:
            gpu = index
        else:
            return None
        gi_text = labels.get("GPU_I_ID", "")
        mig = int(gi_text) if gi_text.isdigit() else None
        if self.given and self.proves(labels, mig):
            return gpu, mig
        if self.gpus is None:  # every GPU of the node, and every slice; never where devices are left to the labels
            return None if self.given else (gpu, mig)
        if mig is None:
            return (gpu, None) if gpu in self.gpus else None
        # another tenant's slice of a GPU in MIG mode is not the run's
        return (gpu, mig) if (gpu, mig) in self.slices or gpu in self.mig_gpus else None

    def proves(self, labels: Mapping[str, str], mig: int | None) -> bool:
        """Whether a series' labels name a device of `given`: a GPU's UUID, a MIG device's UUID in any label (newer exporters),
        MIG-GPU-<uuid>/<gi>/<ci>'s GPU and instance, or, where no label names a MIG device, the run's own job or pod."""
        values = {str(v).lower() for v in labels.values()}
        named_mig = any(v.startswith("mig-") for v in values)
        for given in self.given:
            old, token = OLD_MIG.match(given), given.lower()
            if old and mig is not None and series_uuid(labels).lower() == old.group(1).lower() and mig == int(old.group(2)):
                return True
            if not old and token.startswith("mig-") and mig is not None and token in values:
                return True
            if token.startswith("gpu-") and mig is None and series_uuid(labels).lower() == token:
                return True
        return not named_mig and any(labels.get(name) == value for name, value in self.owners.items())

    def owns_job(self, labels: Mapping[str, str]) -> bool:
        """Whether a series of a Slurm job's cgroup is the whole of the run's job (the cgroup exporter's jobid; no step, no task)."""
        job = self.owners.get(JOBID)
        return bool(job) and labels.get(JOBID) == job and not any(labels.get(name) for name in STEP_LABELS)


def series_key(labels: Mapping[str, str], wanted: Wanted) -> tuple[str, float] | None:
    """(catalogue key, scale) of an exporter series the run watches, e.g. system/gpu_0_mig_3_sm_active, or the run's Slurm
    job's own CPU from its cgroup (system/process_cpu_utilization_percentage); None otherwise."""
    name = labels.get("__name__", "")
    if name in CGROUP_EXPORTER_METRICS:
        metric, scale = CGROUP_EXPORTER_METRICS[name]
        return (key(metric), scale) if wanted.owns_job(labels) else None
    found = EXPORTER_METRICS.get(name)
    place = wanted.place(labels)
    if found is None or place is None:
        return None
    metric, scale = found
    return key(metric, place[0], mig=place[1]), scale


def scaled(value: float, scale: float) -> float:
    """A value in the exporter's unit in the catalogue's: a scale below 1 divides (136074 mW / 1000 is 136.074 W exactly)."""
    return value * scale if scale >= 1 else value / (1 / scale)


def _rates(samples: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """A counter's rise per second between each two samples, at the later one; none across a reset (a fall)."""
    return [(t, (v - u) * 1000 / (t - s)) for (s, u), (t, v) in zip(samples, samples[1:], strict=False) if t > s and v >= u]


def _keyed(series: Series, wanted: Wanted) -> list[tuple[str, list[tuple[int, float]]]]:
    """(catalogue key, samples in the catalogue unit) of one watched series, NaN left out: one key, or the three clocks_*
    series of a clock event reasons bitmask (clock_reason_series, as for dcgmi dmon's); none for a series not watched."""
    named = series_key(series.labels, wanted)
    if named is None:
        return []
    where, scale = named
    samples = [(t, v) for t, v in series.samples if not math.isnan(v)]
    if series.labels.get("__name__") in EXPORTER_COUNTERS:
        samples = _rates(samples)
    samples = [(t, scaled(v, scale)) for t, v in samples]
    if DCGM_EXPORTER_TAGS.get(series.labels.get("__name__", "")) not in DCGM_CLOCK_REASON_TAGS:
        return [(where, samples)]
    place = wanted.place(series.labels)
    split = [(t, clock_reason_series(v)) for t, v in samples]
    return [(key(reason, place[0], mig=place[1]), [(t, on[reason]) for t, on in split]) for reason in CLOCK_REASON_BITS]


def _new_xids(samples: list[tuple[int, float]], born: bool) -> list[tuple[int, float]]:
    """dcgm-exporter's XID gauge holds the last XID until the exporter restarts: the code where it changes, 0 where it
    repeats. Its first sample is new only where the series was `born` in the window (the device's other series were
    scraped before it); otherwise it may come from before the window: 0. The same code twice in a row is one."""
    out, last = [], None
    for stamp, code in samples:
        out.append((stamp, code if (born if last is None else code != last) else 0.0))
        last = code
    return out


def _split_shares(found: list[Series], wanted: Wanted) -> tuple[list[Series], dict[str, list[tuple[int, float]]]]:
    """dcgm-exporter's per-process mode (time-shared GPUs): GPU_UTIL and FB_USED come as the device's series (no pod label)
    and one per pod with that pod's own value. At a scrape where the device's series has a sample, a pod's sample is
    the pod's share, never the device's: it is taken out, and where the pod is the run's (wanted.owners) it is the run's
    share key (DCGM_EXPORTER_POD_SHARES; the copies of one pod's containers once). Every other series is left as it is."""
    device: dict[tuple[tuple[str, str], ...], set[int]] = {}  # a device's per-process metric -> its own series' scrapes
    for series in found:
        if series.labels.get("__name__") in DCGM_EXPORTER_POD_SHARES and not pod_of(series.labels):
            device.setdefault(_group(series.labels), set()).update(t for t, _ in series.samples)
    if not device:
        return found, {}
    run_pod = next((wanted.owners[name] for name in POD_LABELS if wanted.owners.get(name)), "")
    kept: list[Series] = []
    shares: dict[str, dict[int, float]] = {}
    for series in found:
        name, pod = series.labels.get("__name__", ""), pod_of(series.labels)
        stamps = device.get(_group(series.labels), set()) if pod and name in DCGM_EXPORTER_POD_SHARES else set()
        left = [(t, v) for t, v in series.samples if t not in stamps]
        if left or not stamps:
            kept.append(Series(series.labels, left))
        place = wanted.place(series.labels) if stamps and pod == run_pod else None
        if place is None:
            continue
        metric, scale = DCGM_EXPORTER_POD_SHARES[name]
        share = shares.setdefault(key(metric, place[0], mig=place[1]), {})
        for stamp, value in series.samples:
            if stamp in stamps and not math.isnan(value):
                share.setdefault(stamp, scaled(value, scale))
    return kept, {where: sorted(samples.items()) for where, samples in shares.items() if samples}


def _group(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A series' metric and device, whoever uses it: the series of one device's metric, the device's own and its pods'."""
    return tuple(sorted(_device(labels).items()))


_RANK = {name: rank for rank, family in reversed(list(enumerate(EXPORTER_FAMILIES))) for name in family.metrics}  # a name's family's place


def keyed_samples(found: Iterable[Series], wanted: Wanted, conflicts: list[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """{catalogue key: [(timestamp ms, value in the catalogue unit)]} of the watched series; NaN samples left out.

    Two series of one device are one: an exporter adds a job's label (jobid, hpc_job, pod) while the job runs and drops it
    after, so a device's series changes its labels at a job's start and end; their samples are joined (so are the
    identical copies dcgm-exporter writes per pod of a time-shared GPU). Per-pod values are not the device's (_split_shares). Otherwise two series
    for one key are never merged: dcgm-exporter's is kept over radt monitor's (both on the node); two of one metric (a
    host label that matches two nodes, two dcgm-exporters) keep the first and say the clash in `conflicts`.
    dcgm-exporter's clock event reasons bitmask becomes the three clocks_* series, its XID gauge the new XIDs (_new_xids)."""
    found, shares = _split_shares(list(found), wanted)
    out: dict[str, list[tuple[int, float]]] = {}
    owner: dict[str, dict[str, str]] = {}
    found = sorted(found, key=lambda s: _RANK.get(s.labels.get("__name__", ""), len(EXPORTER_FAMILIES)))  # dcgm-exporter's first
    for series in found:
        for where, samples in _keyed(series, wanted):
            if where in owner:
                if _device(owner[where]) == _device(series.labels):  # the same device before, during or after a job
                    joined = dict(out[where])
                    joined.update((t, v) for t, v in samples if t not in joined)
                    out[where] = sorted(joined.items())
                elif conflicts is not None and owner[where].get("__name__") == series.labels.get("__name__"):  # not two exporters: two GPUs
                    conflicts.append(f"{where}: {_labels(owner[where])} and {_labels(series.labels)}")
                continue
            owner[where] = series.labels
            out[where] = sorted(samples)
    for where, labels in owner.items():
        if labels.get("__name__") == DCGM_EXPORTER_NAMES[XID_TAG] and out[where]:
            out[where] = _new_xids(out[where], born=out[where][0][0] > _first_scrape(found, labels, out[where][0][0]))
    return out | shares


def _first_scrape(found: list[Series], labels: Mapping[str, str], default: int) -> int:
    """When the dcgm-exporter that published `labels` first scraped that device within the window asked for."""
    return min((t for s in found if _same_exporter(s.labels, labels) for t, _ in s.samples[:1]), default=default)


def _same_exporter(labels: Mapping[str, str], other: Mapping[str, str]) -> bool:
    """Whether two series come from one dcgm-exporter's scrapes of one device (all its series share the scrape's time)."""
    return labels.get("__name__", "") in DCGM_EXPORTER_METRICS and _device(labels, "__name__") == _device(other, "__name__")


def _device(labels: Mapping[str, str], *also: str) -> dict[str, str]:
    """A series' labels without those naming who used the device (a job's, a pod's) or the error it reports (and `also`):
    what names the device itself."""
    left_out = {*JOB_LABELS, *USER_LABELS, *POD_LABELS, *POD_DETAIL_LABELS, *ERROR_LABELS, *also}
    return {k: v for k, v in labels.items() if k not in left_out}


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") + "}"
