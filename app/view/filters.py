"""The run filter: one line that narrows a long run list to the runs worth comparing.

Four kinds of term, joined by AND (or only by spaces):

- words, as the filter always read them: ``resnet mps batch=256`` keeps the runs whose name, workload,
  letter, status or ``param=value`` pairs contain every word;
- MLflow's search syntax, read the way ``MlflowClient.search_runs(filter_string=...)`` reads it
  (mlflow/utils/search_utils.py): ``params.batch_size = '128'``, ``tags.`mlflow.runName` LIKE 'r%'``,
  ``attributes.status IN ('FINISHED', 'RUNNING')``, ``metrics.loss < 0.5`` (the latest value);
- radt's own per-run figures: ``smact.mean < 0.3``, ``duration > 10m``, ``throughput >= 1200`` and the
  other ``FIELDS``, from app/summary/summaries.py's summary (through data.summary's cache), and the footprint
  (``energy.kwh > 1``, ``idle.gpu_hours >= 2``) from the run's radt.footprint.* tags;
- radt's words for tags (``TAG_FIELDS``): ``diagnosis LIKE '%input_starved%'`` reads the run's finding codes
  (radt.diagnosis), ``partition = 'a100'`` and ``job`` a Slurm job's.

``parse`` turns the text into terms or raises FilterError, one line saying what to change; ``apply``
keeps the rows of a data.runs() frame that pass every term, reading latest metrics and summaries only
for the runs the cheaper terms left.

Every term takes time linear in the value it reads (issue #24: a link must not hold a dashboard worker):
LIKE/ILIKE are matched without backtracking (``like_matcher``), on patterns of at most LIKE_PATTERN_LIMIT
characters and the first LIKE_VALUE_LIMIT characters of a value.
"""

from __future__ import annotations

import difflib
import functools
import heapq
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
import sqlalchemy as sa

from radt.app.db import deadline
from radt.app.db.runs import list_metric_keys
from radt.app.db.state import STATE
from radt.app.db.store import LATEST, chunks, plain_rows
from radt.app.view import data
from radt.app.view.cache import LISTING_TIMEOUT
from radt.catalogue import METRICS, MetricName, unit_text
from radt.errors import UserError
from radt.footprint import figures_of
from radt.runmodel import DIAGNOSIS_TAG, SLURM_JOB_TAG, SLURM_PARTITION_TAG


class FilterError(UserError, ValueError):
    """A run filter that cannot be read; the message (one line) says what to change."""


# --- the fields -----------------------------------------------------------------------------------

NUMBER_OPS = ("=", "!=", "<", "<=", ">", ">=")
TEXT_OPS = ("=", "!=", "LIKE", "ILIKE", "IN", "NOT IN", "IS NULL", "IS NOT NULL")  # MLflow's for params and tags, with IN as for attributes
ENTITIES = {  # MLflow's prefixes and their alternates (search_utils.SearchUtils._VALID_IDENTIFIERS)
    "metric": "metric",
    "metrics": "metric",
    "param": "param",
    "params": "param",
    "parameter": "param",
    "parameters": "param",
    "tag": "tag",
    "tags": "tag",
    "attribute": "attribute",
    "attributes": "attribute",
    "attr": "attribute",
    "run": "attribute",
}
TEXT_ATTRIBUTES = {"run_id": "run_id", "run_name": "run_name", "run name": "run_name", "status": "status", "experiment_id": "experiment_id"}
NUMBER_ATTRIBUTES = {"start_time": "start_time", "created": "start_time", "end_time": "end_time"}  # ms since the epoch, as MLflow stores them
UNREAD_ATTRIBUTES = ("user_id", "artifact_uri")  # searchable in MLflow, not in radt's run list


@dataclass(frozen=True)
class Field:
    """One of radt's figures of a run: where it comes from, and the units a value may carry (factor to the stored unit)."""

    column: str  # a data.runs column, a data.summary column, "throughput", or a radt.footprint.<figure>
    source: str  # "runs" (the run list, free), "footprint" (the run's radt.footprint.* tags, in the run list: free) or "summary" (data.summary, computed once per run and cached)
    units: dict[str, float]
    unit_text: str  # how the help names the units


_SECONDS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_RATIO = {"": 1.0, "%": 0.01}
_PLAIN = {"": 1.0}
_RATIO_TEXT = f"{unit_text(METRICS[MetricName.SM_ACTIVE])} or %"
FIELDS = {  # the GPU figures are over the GPUs the run used (summaries.run_summary; README, "Summary table")
    "smact.mean": Field("smact_mean", "summary", _RATIO, _RATIO_TEXT),
    "smact.p95": Field("smact_p95", "summary", _RATIO, _RATIO_TEXT),
    "smact.busiest": Field("smact_busiest", "summary", _RATIO, _RATIO_TEXT),  # the mean SMACT of the run's busiest GPU
    "smocc.mean": Field("smocc_mean", "summary", _RATIO, _RATIO_TEXT),
    "smocc.p95": Field("smocc_p95", "summary", _RATIO, _RATIO_TEXT),
    "gract.mean": Field("gract_mean", "summary", _RATIO, _RATIO_TEXT),
    "power.mean": Field("power_mean_w", "summary", {"": 1.0, "w": 1.0, "kw": 1000.0}, f"{unit_text(METRICS[MetricName.POWER_USAGE_WATTS])} or kW"),
    "gpus.used": Field("gpus_used", "summary", _PLAIN, "GPUs or MIG slices"),
    "share.sm": Field("run_sm_share", "summary", {"": 1.0, "%": 1.0}, "% of a GPU"),  # the run's own SM share (NVML per-process)
    "duration": Field("duration_s", "runs", _SECONDS, "s, m or h"),  # the run's time, as the run tree shows it
    "steps": Field("own_steps", "summary", _PLAIN, "the steps the script's metrics count (its highest step, + 1 from step 0)"),
    "throughput": Field("throughput", "summary", _PLAIN, "steps/h"),
    "memory.peak": Field("gpu_memory_peak_mb", "summary", {"": 1.0, "mb": 1.0, "gb": 1000.0}, "MB or GB"),
    "memory.run_peak": Field("run_memory_peak_mb", "summary", {"": 1.0, "mb": 1.0, "gb": 1000.0}, "MB or GB"),  # the run's own processes'
    "energy": Field("energy_j", "summary", {"": 1000.0, "j": 1.0, "kj": 1000.0, "mj": 1e6, "wh": 3600.0, "kwh": 3.6e6}, "kJ, J, MJ, Wh or kWh"),
    "cpu.mean": Field("cpu_mean", "summary", {"": 1.0, "%": 1.0}, unit_text(METRICS[MetricName.CPU_UTILIZATION_PERCENTAGE])),  # the host's
    # the run's footprint (radt/footprint.py, radt.footprint.* tags: `radt diagnose`, a run's end, an import)
    "energy.kwh": Field("energy_kwh", "footprint", {"": 1.0, "kwh": 1.0, "wh": 0.001, "mwh": 1000.0}, "kWh, Wh or MWh"),
    "co2.kg": Field("co2_kg", "footprint", {"": 1.0, "kg": 1.0, "g": 0.001, "t": 1000.0}, "kg, g or t"),
    "cost": Field("cost", "footprint", _PLAIN, "the currency of RADT_CURRENCY"),
    "gpu_hours": Field("gpu_hours", "footprint", {"": 1.0, "h": 1.0}, "GPU-hours"),
    "idle.gpu_hours": Field("idle_gpu_hours", "footprint", {"": 1.0, "h": 1.0}, "GPU-hours"),
}
LISTED = ("runs", "footprint")  # the sources the run list holds: read row by row, before any summary
TEXT_FIELDS = {"letter": "letter"}  # radt's own words for a run (its radt.letter tag or radT's letter param), compared like attributes
TAG_FIELDS = {  # radt's words for tags: the diagnosis' codes (`diagnosis LIKE '%input_starved%'`), a Slurm job's (`partition = 'a100'`)
    "diagnosis": DIAGNOSIS_TAG,
    "partition": SLURM_PARTITION_TAG,
    "job": SLURM_JOB_TAG,
}
FIELD_NAMES = ", ".join([*FIELDS, *TEXT_FIELDS, *TAG_FIELDS])
UNKNOWN_HINT = f"use params., tags., attributes., metrics. or one of {FIELD_NAMES}"
LIKE_PATTERN_LIMIT = 250  # characters of a LIKE/ILIKE pattern (as many as MLflow allows in a key); a longer one is refused
LIKE_VALUE_LIMIT = 8000  # LIKE/ILIKE read a value's first 8,000 characters: all of any MLflow stores (params 6,000, tags 8,000)
TERM_LIMIT = 32  # different conditions in one filter: each is read against every run (a link of 500 words held a worker 37 s)


@dataclass(frozen=True)
class Term:
    """One condition a run must meet: ``kind`` is word, param, tag, attribute, text (workload, letter), metric or field."""

    kind: str
    key: str
    op: str = ""
    value: object = None


@dataclass(frozen=True)
class Query:
    """A parsed filter: every term must hold."""

    text: str
    terms: tuple[Term, ...]

    @property
    def structured(self) -> bool:
        """Whether it holds anything beyond plain words."""
        return any(t.kind != "word" for t in self.terms)


# --- tokens ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    kind: str  # word, string, op, lparen, rparen, comma
    text: str  # as typed (a string: its contents, quotes removed)
    start: int
    end: int


_OPS = ("!=", "<>", "<=", ">=", "==", "=", "<", ">")
_SPECIAL = "=!<>(),'\""


def tokens(text: str) -> list[Token]:
    """The filter's tokens; a word may hold `backticked` parts (MLflow's quoting of keys with dots or spaces)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "'\"":
            j, chars = i + 1, []
            while True:
                if j >= n:
                    raise FilterError(f"unclosed quote {c} at character {i + 1}: close it, as in params.model = 'resnet50'")
                if text[j] == c and text[j + 1 : j + 2] == c:  # '' inside '...': one quote, as in SQL
                    chars.append(c)
                    j += 2
                elif text[j] == c:
                    break
                else:
                    chars.append(text[j])
                    j += 1
            out.append(Token("string", "".join(chars), i, j + 1))
            i = j + 1
        elif c in "(),":
            out.append(Token({"(": "lparen", ")": "rparen", ",": "comma"}[c], c, i, i + 1))
            i += 1
        elif text.startswith(_OPS, i):
            op = next(o for o in _OPS if text.startswith(o, i))
            out.append(Token("op", {"<>": "!=", "==": "="}.get(op, op), i, i + len(op)))
            i += len(op)
        else:
            j = i
            while j < n and not text[j].isspace() and (text[j] not in _SPECIAL or (text[j] == "!" and text[j + 1 : j + 2] != "=")):
                if text[j] == "`":
                    close = text.find("`", j + 1)
                    if close < 0:
                        raise FilterError(f"unclosed backtick at character {j + 1}: write tags.`mlflow.runName`")
                    j = close + 1
                else:
                    j += 1
            out.append(Token("word", text[i:j], i, j))
            i = j
    return out


# --- parsing --------------------------------------------------------------------------------------

_KEYWORD_OPS = ("LIKE", "ILIKE", "IN", "NOT", "IS")


def _unquote(key: str) -> str:
    key = key.strip()
    if len(key) >= 2 and key[0] == key[-1] and key[0] in "`'\"":
        return key[1:-1]
    return key


def _split_key(word: str) -> tuple[str, str | None]:
    """An identifier as (prefix, rest): the first dot outside backticks splits it (MLflow: identifier.split('.', 1))."""
    depth = False
    for i, c in enumerate(word):
        if c == "`":
            depth = not depth
        elif c == "." and not depth:
            return word[:i], word[i + 1 :]
    return word, None


def field_of(word: str) -> tuple[str, str]:
    """(kind, key) of an identifier: an MLflow entity and its key, one of radt's fields, or FilterError naming the ones it knows."""
    lowered = word.lower()
    if lowered in FIELDS:
        return "field", lowered
    if lowered in TEXT_FIELDS:
        return "text", TEXT_FIELDS[lowered]
    if lowered in TAG_FIELDS:
        return "tag", TAG_FIELDS[lowered]
    prefix, rest = _split_key(word)
    prefix = _unquote(prefix)
    if rest is None:  # MLflow: an identifier without a prefix is an attribute
        prefix, rest = "attribute", word
    kind = ENTITIES.get(prefix.lower())
    key = _unquote(rest)
    if kind is None:
        if prefix.lower() in ("dataset", "datasets"):
            raise FilterError(f"'{word}': radt's filter does not read datasets; {UNKNOWN_HINT}")
        raise FilterError(f"unknown field '{word}': {UNKNOWN_HINT}")
    if not key:
        raise FilterError(f"'{word}' names no key: write {prefix}.<key>, as in params.batch_size")
    if kind == "attribute":
        if key in TEXT_ATTRIBUTES:
            return "attribute", TEXT_ATTRIBUTES[key]
        if key in NUMBER_ATTRIBUTES:
            return "number_attribute", NUMBER_ATTRIBUTES[key]
        if key in UNREAD_ATTRIBUTES:
            raise FilterError(f"attributes.{key} is not in radt's run list: use run_id, run_name, status, start_time or end_time")
        if rest is word:  # a bare word that is no attribute either
            raise FilterError(f"unknown field '{word}': {UNKNOWN_HINT}")
        raise FilterError(f"unknown attribute '{key}': use run_id, run_name, status, start_time or end_time")
    return kind, key


def _number(token: Token, units: dict[str, float], what: str, unit_text: str = "") -> float:
    """A number as typed (with one of `units`' suffixes, case-insensitive), in the field's stored unit."""
    match = re.fullmatch(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z%]*)", token.text.strip())
    if not match or match.group(2).lower() not in units:
        example = f" ({unit_text})" if unit_text and len(units) > 1 else ""
        raise FilterError(f"{what} {token.text}: expected a number{example}")
    return float(match.group(1)) * units[match.group(2).lower()]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokens(text)
        self.i = 0

    def peek(self, ahead: int = 0) -> Token | None:
        j = self.i + ahead
        return self.toks[j] if j < len(self.toks) else None

    def take(self) -> Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def _is_op_at(self, ahead: int) -> bool:
        tok = self.peek(ahead)
        return tok is not None and (tok.kind == "op" or (tok.kind == "word" and tok.text.upper() in _KEYWORD_OPS))

    def parse(self) -> Query:
        terms = []
        while self.peek() is not None:
            tok = self.peek()
            if tok.kind == "word" and tok.text.upper() == "AND":
                self.i += 1
                continue
            if tok.kind == "word" and tok.text.upper() == "OR":
                raise FilterError("OR is not supported: MLflow's filter joins comparisons with AND (use IN ('a', 'b') for either value)")
            if tok.kind == "word" and self._is_op_at(1):
                legacy = self._legacy_word()
                terms.append(legacy or self._comparison())
            elif tok.kind in ("word", "string"):
                self.i += 1
                terms.append(Term("word", tok.text.lower()))
            else:
                raise FilterError(f"unexpected '{tok.text}' at character {tok.start + 1}: write field op value, as in smact.mean < 0.3")
        unique = list({_identity(t): t for t in terms}.values())  # "a a a ... a" is one condition, read once
        if len(unique) > TERM_LIMIT:
            raise FilterError(f"the filter has {len(unique)} different conditions, over {TERM_LIMIT}: keep the ones that narrow the runs most")
        return Query(self.text, tuple(unique))

    def _legacy_word(self) -> Term | None:
        """`batch=256` typed as one word, with a key that is no field: a word of the old filter, matched in the param=value pairs."""
        key, op, value = self.peek(), self.peek(1), self.peek(2)
        if op.text != "=" or value is None or value.kind != "word" or key.end != op.start or op.end != value.start:
            return None
        try:
            field_of(key.text)
        except FilterError:
            self.i += 3
            return Term("word", self.text[key.start : value.end].lower())
        return None

    def _comparison(self) -> Term:
        key_tok = self.take()
        kind, key = field_of(key_tok.text)
        op = self._operator(key_tok)
        what = f"{key_tok.text} {op}"
        if kind in ("metric", "field", "number_attribute"):
            allowed = NUMBER_OPS
        else:
            allowed = TEXT_OPS if kind in ("param", "tag") else tuple(o for o in TEXT_OPS if not o.startswith("IS"))
        if op not in allowed:
            hint = " (params and tags are text: compare numbers with metrics. or radt's fields)" if kind in ("param", "tag") else ""
            raise FilterError(f"{key_tok.text}: '{op}' is not one of {', '.join(allowed)}{hint}")
        if op in ("IS NULL", "IS NOT NULL"):
            return Term(kind, key, op)
        if op in ("IN", "NOT IN"):
            return Term(kind, key, op, tuple(self._list(what)))
        value = self._value(what)
        if op in ("LIKE", "ILIKE") and len(value.text) > LIKE_PATTERN_LIMIT:
            raise FilterError(
                f"the pattern after '{what}' has {len(value.text)} characters, over {LIKE_PATTERN_LIMIT}: keep a shorter part of it between %, as in '%resnet%'"
            )
        if kind == "metric":
            return Term(kind, key, op, _number(value, _PLAIN, what))
        if kind == "number_attribute":
            return Term(kind, key, op, _number(value, _PLAIN, what))
        if kind == "field":
            spec = FIELDS[key]
            return Term(kind, key, op, _number(value, spec.units, what, spec.unit_text))
        return Term(kind, key, op, value.text)

    def _operator(self, key_tok: Token) -> str:
        tok = self.take()
        if tok.kind == "op":
            return tok.text
        word = tok.text.upper()
        nxt = self.peek()
        nxt_word = nxt.text.upper() if nxt is not None and nxt.kind == "word" else ""
        if word == "NOT" and nxt_word in ("IN", "LIKE", "ILIKE"):
            self.i += 1
            if nxt_word != "IN":
                raise FilterError(f"{key_tok.text}: NOT {nxt_word} is not in MLflow's filter; use != or NOT IN")
            return "NOT IN"
        if word == "IS":
            if nxt_word == "NULL":
                self.i += 1
                return "IS NULL"
            if nxt_word == "NOT" and (self.peek(1) is not None and self.peek(1).text.upper() == "NULL"):
                self.i += 2
                return "IS NOT NULL"
            raise FilterError(f"{key_tok.text} IS: write IS NULL or IS NOT NULL")
        if word in ("LIKE", "ILIKE", "IN"):
            return word
        raise FilterError(f"{key_tok.text}: expected a comparison (=, !=, <, LIKE, IN ...) after it")

    def _value(self, what: str) -> Token:
        tok = self.peek()
        if tok is None or tok.kind not in ("word", "string") or (tok.kind == "word" and tok.text.upper() == "AND"):
            raise FilterError(f"expected a value after '{what}'")
        self.i += 1
        return tok

    def _list(self, what: str) -> list[str]:
        if self.peek() is None or self.peek().kind != "lparen":
            raise FilterError(f"expected a list after '{what}', as in ('FINISHED', 'RUNNING')")
        self.i += 1
        values = []
        while True:
            values.append(self._value(what).text)
            tok = self.peek()
            if tok is None:
                raise FilterError(f"unclosed list after '{what}': end it with )")
            self.i += 1
            if tok.kind == "rparen":
                return values
            if tok.kind != "comma":
                raise FilterError(f"expected , or ) in the list after '{what}', found '{tok.text}'")


def _identity(term: Term) -> tuple:
    """A term's meaning, for telling repeated conditions apart (an IN list is not hashable)."""
    return (term.kind, term.key, term.op, repr(term.value))


def parse(text: str) -> Query:
    """The filter's terms; FilterError with one line saying what to change."""
    return _Parser(text or "").parse()


# --- evaluation -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def like_matcher(pattern: str, ignore_case: bool = False) -> Callable[[str], bool]:
    """SQL LIKE as MLflow reads it, as a test of a value: % any run of characters (line breaks too), _ one character,
    the whole value, no escape character (as MLflow's in-memory search: a backslash is itself); ILIKE ignores case as
    Python's re does. Linear in the value for each character of the pattern, never backtracking (issue #24).

    The pattern is cut at each %: the first piece must begin the value and the last end it; each piece between is
    taken at its leftmost place after the one before, which leaves the most room for the rest, so no other place is
    ever tried. A piece holds no %, so it matches exactly its length: re.search of it scans, without backtracking.
    A value is read up to its LIKE_VALUE_LIMIT-th character."""
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    texts = pattern.split("%")
    pieces = [re.compile("".join("." if c == "_" else re.escape(c) for c in text), flags) for text in texts]
    if len(pieces) == 1:
        return lambda value: pieces[0].fullmatch(value[:LIKE_VALUE_LIMIT]) is not None
    head, tail = len(texts[0]), len(texts[-1])
    middle = [piece for piece, text in zip(pieces[1:-1], texts[1:-1], strict=True) if text]  # %% is one %

    def match(value: str) -> bool:
        value = value[:LIKE_VALUE_LIMIT]
        start, end = head, len(value) - tail
        if end < start or not pieces[0].match(value) or not pieces[-1].match(value, end):
            return False
        for piece in middle:
            found = piece.search(value, start, end)
            if found is None:
                return False
            start = found.end()
        return True

    return match


_COMPARE: dict[str, Callable[[object, object], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "LIKE": lambda value, pattern: like_matcher(pattern)(value),
    "ILIKE": lambda value, pattern: like_matcher(pattern, ignore_case=True)(value),
    "IN": lambda value, options: value in options,
    "NOT IN": lambda value, options: value not in options,
    "=~": lambda value, other: value.casefold() == other.casefold(),  # not typed: the hint's retry of = ignoring case
}


def _text_test(term: Term, value: str | None) -> bool:
    """A text comparison: a run without the key passes IS NULL only (MLflow joins on the key)."""
    if term.op in ("IS NULL", "IS NOT NULL"):
        return (value is None) == (term.op == "IS NULL")
    return value is not None and _COMPARE[term.op](value, term.value)


def _number_test(term: Term, value: float | None) -> bool:
    """A number comparison: absent fails; NaN passes != alone (MLflow's rule for NaN metrics)."""
    if value is None:
        return False
    if value != value:
        return term.op == "!="
    return _COMPARE[term.op](value, term.value)


def _hay(row) -> str:
    """What a word is looked for in: the run's name, workload, letter, status and param=value pairs (the filter's first form)."""
    parts = [str(row.run_name), str(row.workload_label), str(row.letter), str(row.status)]
    return " ".join(parts + [f"{k}={v}" for k, v in (row.params or {}).items()]).lower()


def _plain(row, term: Term) -> bool:
    """A term read from the run list alone, but a word (_passes looks for words in the run's _hay)."""
    if term.kind == "param":
        return _text_test(term, (row.params or {}).get(term.key))
    if term.kind == "tag":
        return _text_test(term, (row.tags or {}).get(term.key))
    if term.kind in ("attribute", "text"):
        return _text_test(term, None if getattr(row, term.key) is None else str(getattr(row, term.key)))
    if term.kind == "field" and FIELDS[term.key].source == "footprint":
        return _number_test(term, figures_of(row.tags or {}).get(FIELDS[term.key].column))
    number = getattr(row, term.key if term.kind == "number_attribute" else FIELDS[term.key].column)
    return _number_test(term, _present(number))


def _passes(row, others: list[Term], words: list[str]) -> bool:
    """Whether a run meets every run-list term: its words looked for in one text built once (not once per word), and the
    request's deadline checked at each run, so that no filter holds a dashboard worker past RADT_REQUEST_TIMEOUT."""
    deadline.check()
    if not all(_plain(row, t) for t in others):
        return False
    if not words:
        return True
    hay = _hay(row)
    return all(word in hay for word in words)


def _present(value) -> float | None:
    """A run's own figure as a number; None where it has none (NaN: no end time, no SMACT recorded), which no comparison passes."""
    return None if value is None or value != value else float(value)


def latest_metrics(run_ids: Sequence[str], keys: Sequence[str]) -> dict[tuple[str, str], float]:
    """(run_id, key) -> the metric's latest value (NaN where MLflow stored a NaN): latest_metrics, bound parameters, cached briefly."""
    run_ids, keys = sorted(set(run_ids)), sorted(set(keys))
    if not run_ids or not keys or STATE.engine is None:
        return {}

    def load() -> dict[tuple[str, str], float]:
        out = {}
        with STATE.engine.connect() as conn:
            for chunk in chunks(run_ids):
                stmt = sa.select(LATEST.c.run_uuid, LATEST.c.key, LATEST.c.value, LATEST.c.is_nan).where(LATEST.c.run_uuid.in_(chunk), LATEST.c.key.in_(keys))
                for run_id, key, value, is_nan in plain_rows(conn, stmt):
                    out[(run_id, key)] = math.nan if is_nan or value is None else float(value)
        return out

    return data.cached(("filter-latest", tuple(keys), *run_ids), LISTING_TIMEOUT, load)


def _figures(runs: pd.DataFrame) -> dict[str, dict]:
    """run_id -> its summary row (data.summary's cache) with throughput = steps ÷ duration (steps/h, as the summary table)."""
    out = {}
    for row in data.summary(runs).to_dict("records"):
        steps, seconds = row.get("own_steps"), row.get("duration_s")
        ok = steps is not None and seconds is not None and steps == steps and seconds == seconds and seconds > 0
        out[row["run_id"]] = row | {"throughput": steps / seconds * 3600 if ok else math.nan}
    return out


def apply(runs: pd.DataFrame, query: Query | str) -> pd.DataFrame:
    """The rows of a data.runs() frame that pass every term (FilterError for a text that cannot be read).

    Run-list terms first; latest metrics (one query) and summaries (data.summary) only for the runs still left."""
    query = parse(query) if isinstance(query, str) else query
    if not query.terms or runs.empty:
        return runs
    plain = [t for t in query.terms if t.kind not in ("metric", "field") or (t.kind == "field" and FIELDS[t.key].source in LISTED)]
    words, others = [t.key for t in plain if t.kind == "word"], [t for t in plain if t.kind != "word"]
    kept = runs[[_passes(row, others, words) for row in runs.itertuples()]] if plain else runs
    metric_terms = [t for t in query.terms if t.kind == "metric"]
    if metric_terms and not kept.empty:
        latest = latest_metrics(list(kept["run_id"]), [t.key for t in metric_terms])
        kept = kept[[all(_number_test(t, latest.get((r, t.key))) for t in metric_terms) for r in kept["run_id"]]]
    field_terms = [t for t in query.terms if t.kind == "field" and FIELDS[t.key].source == "summary"]
    if field_terms and not kept.empty:
        figures = _figures(kept)
        kept = kept[[all(_number_test(t, _present(figures.get(r, {}).get(FIELDS[t.key].column))) for t in field_terms) for r in kept["run_id"]]]
    return kept


@dataclass(frozen=True)
class Narrowed:
    """What the picker shows: the matching runs, the one-line reason when the filter could not be read (then every run),
    and a hint when nothing matches: a key no run has, or a text that would match with its case ignored."""

    runs: pd.DataFrame
    error: str = ""
    hint: str = ""


PREFIXES = {"param": "params.", "tag": "tags.", "attribute": "attributes.", "text": "", "metric": "metrics."}
KEYS_LISTED = 12  # the params a hint lists when the one asked for is held by no run
KEY_SHOWN = 60  # characters of a missing key a hint repeats


def _case_hint(runs: pd.DataFrame, query: Query) -> str:
    """MLflow's = is case-sensitive ('MPS' is not the stored 'mps'): when ignoring case would match, say so and how."""
    loose = [t for t in query.terms if t.kind in PREFIXES and t.op == "="]
    if not loose:
        return ""
    relaxed = Query(query.text, tuple(Term(t.kind, t.key, "=~", t.value) if t in loose else t for t in query.terms))
    found = len(apply(runs, relaxed))
    if not found:
        return ""
    example = f"{PREFIXES[loose[0].kind]}{loose[0].key} ILIKE '{loose[0].value}'"
    return f"No run matches; {found} would with the case ignored: = compares exactly, as in MLflow; write {example}."


def _written(key: str) -> str:
    """A key as MLflow's syntax writes it: in backticks where it holds more than letters, digits, '_' and '.'."""
    return key if re.fullmatch(r"[\w.]+", key) else f"`{key}`"


def _loose(key: str) -> str:
    return key.lower().replace("-", "_").replace(" ", "_")


HINT_CUTOFF = 0.8  # difflib's similarity a key needs to be offered as the one meant
HINT_COMPARED = 16  # keys whose full similarity a hint computes (the closest by difflib's cheap upper bound)


def closest(word: str, keys: Sequence[str]) -> str | None:
    """difflib.get_close_matches(word, keys, n=1, cutoff=HINT_CUTOFF), bounded: SequenceMatcher.ratio is quadratic in the
    length, and 2,000 params of ~210 characters held a worker 22 s. Every key gets the cheap upper bounds (quick_ratio,
    linear), only the HINT_COMPARED highest the full ratio, from the highest down until no bound left can beat the best
    found: the same answer as difflib's wherever it stops there, the deadline checked between keys."""
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(word)
    bounds = []
    for key in keys:
        deadline.check()
        matcher.set_seq1(key)
        if matcher.real_quick_ratio() >= HINT_CUTOFF and (bound := matcher.quick_ratio()) >= HINT_CUTOFF:
            bounds.append((bound, key))
    best: tuple[float, str] | None = None  # difflib's order: the highest ratio, then the greatest key
    for bound, key in heapq.nlargest(HINT_COMPARED, bounds):
        if best is not None and bound < best[0]:
            break
        deadline.check()
        matcher.set_seq1(key)
        ratio = matcher.ratio()
        if ratio >= HINT_CUTOFF and (best is None or (ratio, key) > best):
            best = (ratio, key)
    return None if best is None else best[1]


def _key_hint(runs: pd.DataFrame, query: Query) -> str:
    """A param, tag or metric no run here has (batch-size for batch_size, a typo) matches nothing, which looks like no
    run qualifying: say so, with the key meant where one is close, else the params there are."""

    @functools.cache
    def keys_of(kind: str) -> list[str]:
        """The keys the runs hold, read once per kind however many terms name one (metrics: one query)."""
        if kind == "metric":
            return list_metric_keys(STATE.engine, list(runs["run_id"])) if STATE.engine is not None else []
        return sorted({k for values in runs["params" if kind == "param" else "tags"] if isinstance(values, dict) for k in values})

    for term in query.terms:
        if term.kind not in ("param", "tag", "metric") or term.op in ("IS NULL", "IS NOT NULL"):
            continue
        held = keys_of(term.kind)
        if term.key in held:
            continue
        by_loose = {_loose(k): k for k in held}
        close = closest(_loose(term.key), list(by_loose))
        shown = term.key if len(term.key) <= KEY_SHOWN else f"{term.key[: KEY_SHOWN - 1]}…"  # a link's key is anyone's text
        said = f"No run here has the {term.kind} '{shown}'"
        if close:
            return f"{said}: did you mean {PREFIXES[term.kind]}{_written(by_loose[close])}?"
        if term.kind == "param" and held:
            return f"{said}; the params here: {', '.join(held[:KEYS_LISTED])}{', …' if len(held) > KEYS_LISTED else ''}."
        return f"{said}."
    return ""


def narrow(runs: pd.DataFrame, text: str) -> Narrowed:
    """`apply`, for a page: a filter that cannot be read keeps every run and says why, instead of matching nothing."""
    try:
        query = parse(text or "")
        kept = apply(runs, query)
    except FilterError as exc:
        return Narrowed(runs, str(exc))
    return Narrowed(kept, hint=(_key_hint(runs, query) or _case_hint(runs, query)) if kept.empty and not runs.empty else "")
