"""Every server-side callback of the dashboard answers junk with 200 (or 204: nothing to update), and a malformed
request with a 4xx: never an HTTP 500.

Anyone who can reach the dashboard can post any body to `/_dash-update-component`. Against a real `python app.py` on a
store with a few runs (one of them training now, so Live has a card): the callback list is the app's own
`GET /_dash-dependencies`; each server-side callback is first posted as the browser would, with the component values the
pages really hold (its answers feed the next callbacks: the view, the summary rows, the live cards), then with junk in
each input and state (wrong types, NUL bytes, huge strings, NaN and infinities, nested junk, pieces of the real values
swapped), extra keys, and malformed bodies (not JSON, a list, no output, an unknown or clientside output, inputs missing
or of the wrong shape). Old dashboard: 147 HTTP 500s over 1,576 junk posts.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
import requests
from mlflow import MlflowClient

from radt.collectors.store import tracking
from radt.collectors.store.stores import SqlMetricStore
from radt.points import Point
from tests.support.browser import dashboard
from tests.support.radtproc import radt_env
from tests.support.runs import radt_run

SEED = 24
POSTS = 1_600  # junk requests in all, spread over the callbacks
UPDATE = "_dash-update-component"
OK = (200, 204)  # an answer (a message where the input was junk), or PreventUpdate's "nothing to change"
NOT_AN_ADDRESS = {"error": "the page's address is not a path (/...) and a query string"}  # Dash's page router reads only an address
HUGE = "x" * 200_000
WILD = ("ALL", "MATCH", "ALLSMALLER")
JUNK = [None, True, False, 0, -1, 7, 2**63, -(2**70), 1e308, -1e308, float("nan"), float("inf"), float("-inf"), 0.5, -0.0,
        "", "\x00", "a\x00b", "NaN", "inf", "-1", "1e999", "<b>x</b>", "../../etc/passwd", "%00", "' OR 1=1 --", HUGE,
        "ü" * 5000, [], [None], [[[]]], ["\x00", 5, None, {}], list(range(300)), {}, {"a": None}, {"range": "\x00", "axis": 5},
        {"x": {"y": {"z": [float("nan")]}}}, {"runs": 5, "metrics": "x", "experiments": {}}]  # fmt: skip


def _fill(uri: str) -> dict:
    """An experiment with a finished run (SMACT and a metric of its own) and a run training now."""
    client = MlflowClient(uri)
    experiment = tracking.resolve_experiment(client, uri, "fuzz")
    start = 1_760_000_000_000
    done = radt_run(client, experiment, "done", start_time=start)
    now = int(time.time() * 1000)
    running = radt_run(client, experiment, "running", start_time=now - 60_000, letter="B")
    store = SqlMetricStore(uri)
    store.write(done, [Point("system/gpu_0_sm_active", 0.5, start + i * 1000, i) for i in range(60)])
    store.write(done, [Point("loss", 1.0 / (i + 1), start + i * 1000, i) for i in range(60)])
    store.write(running, [Point("system/gpu_0_sm_active", 0.3, now - 60_000 + i * 1000, i) for i in range(60)])
    store.close()
    client.set_terminated(done, "FINISHED", end_time=start + 60_000)
    return {"experiment": experiment, "done": done, "running": running}


@pytest.fixture(scope="module")
def served(tmp_path_factory, sqlite_template):
    """`python app.py` on a SQLite store holding the fuzz experiment."""
    home = tmp_path_factory.mktemp("fuzz")
    shutil.copy(sqlite_template, home / "store.db")
    uri = f"sqlite:///{home / 'store.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADT_HOME", str(home))
        ids = _fill(uri)
    with dashboard(uri, radt_env(home)) as base, requests.Session() as session:
        yield {"base": base, "session": session, **ids}


# --- the callbacks, and requests for them as the browser sends them ----------------------------------------


def _dep_id(dep_id: str):
    """A dependency's id as Dash lists it: a string, or the JSON of a pattern (with wildcards as ["ALL"])."""
    return json.loads(dep_id) if dep_id.startswith("{") else dep_id


def _wild(pattern) -> str | None:
    """ALL, MATCH or ALLSMALLER for a pattern id, else None."""
    if not isinstance(pattern, dict):
        return None
    return next((v[0] for v in pattern.values() if isinstance(v, list) and v and v[0] in WILD), None)


def _matches(pattern: dict, concrete) -> bool:
    if not isinstance(concrete, dict) or set(concrete) != set(pattern):
        return False
    return all(isinstance(v, list) or concrete[k] == v for k, v in pattern.items())


def _outputs(output: str) -> list[dict]:
    """The output string of a callback (`..a.b...c.d..` for several) as {id, property} items."""
    parts = output[2:-2].split("...") if output.startswith("..") else [output]
    return [{"id": _dep_id(p.rsplit(".", 1)[0]), "property": p.rsplit(".", 1)[1]} for p in parts]


@dataclass
class Components:
    """What the pages hold: (id, property) -> value, from the layouts and the callbacks' answers."""

    values: dict[tuple[str, str], object] = field(default_factory=dict)
    ids: list = field(default_factory=list)  # every component id seen, dict ones included

    def key(self, component_id) -> str:
        return json.dumps(component_id, sort_keys=True) if isinstance(component_id, dict) else str(component_id)

    def add(self, component_id, prop: str, value) -> None:
        if component_id not in self.ids:
            self.ids.append(component_id)
        self.values[(self.key(component_id), prop)] = value

    def walk(self, node) -> None:
        """Every component of a layout (Dash's JSON) with its props."""
        if isinstance(node, list):
            for child in node:
                self.walk(child)
        elif isinstance(node, dict):
            props = node.get("props") if "namespace" in node else None
            if isinstance(props, dict):
                if "id" in props:
                    for prop, value in props.items():
                        self.add(props["id"], prop, value)
                for value in props.values():
                    self.walk(value)
            else:
                for value in node.values():
                    self.walk(value)

    def value(self, component_id, prop: str):
        return self.values.get((self.key(component_id), prop))

    def concrete(self, pattern) -> list:
        """The component ids a dependency stands for: itself, or the ids seen that its pattern matches."""
        if not _wild(pattern):
            return [pattern]
        return [i for i in self.ids if _matches(pattern, i)]


def _item(components: Components, dep: dict):
    """One input or state of a request: a dict, or a list of dicts for ALL / ALLSMALLER."""
    pattern = _dep_id(dep["id"])
    found = [{"id": i, "property": dep["property"], "value": components.value(i, dep["property"])} for i in components.concrete(pattern)]
    if _wild(pattern) in ("ALL", "ALLSMALLER"):
        return found
    return found[0] if found else {"id": pattern, "property": dep["property"], "value": None}


def _output_items(components: Components, callback: dict, inputs: list) -> list | dict:
    """The outputs part of a request; a MATCH output takes the wildcard's value from the MATCH input."""
    items = []
    for out in _outputs(callback["output"]):
        wild = _wild(out["id"])
        if wild == "ALL":
            items.append([{"id": i, "property": out["property"]} for i in components.concrete(out["id"])])
        elif wild == "MATCH":
            matched = next((i["id"] for i in inputs if isinstance(i, dict) and isinstance(i.get("id"), dict)), out["id"])
            items.append({"id": {k: (matched.get(k) if isinstance(v, list) else v) for k, v in out["id"].items()}, "property": out["property"]})
        else:
            items.append(out)
    return items if callback["output"].startswith("..") else items[0]


def request_body(components: Components, callback: dict) -> dict:
    """The request a browser showing these components sends for `callback`."""
    inputs = [_item(components, d) for d in callback["inputs"]]
    state = [_item(components, d) for d in callback["state"]]
    changed = [f"{components.key(inputs[0]['id'])}.{inputs[0]['property']}"] if inputs and isinstance(inputs[0], dict) else []
    return {"output": callback["output"], "outputs": _output_items(components, callback, inputs), "inputs": inputs, "state": state, "changedPropIds": changed}


def post(served: dict, body, raw: bytes | None = None, content_type: str = "application/json") -> requests.Response:
    data = raw if raw is not None else json.dumps(body).encode()
    return served["session"].post(served["base"] + UPDATE, data=data, headers={"Content-Type": content_type}, timeout=120)


def learn(served: dict, components: Components, body: dict, response: requests.Response) -> None:
    """What a callback answered becomes what the page holds (a view, the summary rows, live cards...)."""
    if response.status_code != 200:
        return
    answer = response.json().get("response", {})
    for key, props in answer.items():
        component_id = json.loads(key) if key.startswith("{") else key
        for prop, value in props.items():
            components.add(component_id, prop, value)
            components.walk(value)


def page(served: dict, callbacks: list[dict], components: Components, path: str, search: str = "") -> None:
    """Dash's pages callback for this address: the page's layout and its components."""
    router = next(c for c in callbacks if any(d["id"] == "_pages_location" for d in c["inputs"]))
    components.add("_pages_location", "pathname", path)
    components.add("_pages_location", "search", search)
    body = request_body(components, router)
    response = post(served, body)
    assert response.status_code == 200, response.text[:500]
    learn(served, components, body, response)


@pytest.fixture(scope="module")
def app_callbacks(served) -> tuple[list[dict], Components]:
    """The server-side callbacks, from the app's own list, and the component values the pages really hold."""
    deps = served["session"].get(served["base"] + "_dash-dependencies", timeout=60).json()
    server_side = [d for d in deps if not d.get("clientside_function")]
    components = Components()
    layout = served["session"].get(served["base"] + "_dash-layout", timeout=60).json()
    components.walk(layout)
    search = f"?exp={served['experiment']}&runs={served['done']},{served['running']}&metrics=cat:sm_active&metrics=key:loss"
    page(served, server_side, components, "/", search)
    page(served, server_side, components, "/live")
    for _ in range(3):  # the answers of one callback are the inputs of the next: the view, then the summary rows...
        for callback in server_side:
            body = request_body(components, callback)
            learn(served, components, body, post(served, body))
    page(served, server_side, components, "/", search)  # the explore page's components again (Live's pages callback replaced them)
    return server_side, components


# --- junk ---------------------------------------------------------------------------------------------------


def junk(rng: random.Random, depth: int = 0):
    """A junk JSON value: one of JUNK, or a random nest of them."""
    if depth < 3 and rng.random() < 0.2:
        if rng.random() < 0.5:
            return [junk(rng, depth + 1) for _ in range(rng.randint(0, 4))]
        return {rng.choice(["a", "runs", "range", "axis", "\x00", ""]): junk(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice(JUNK)


def mutate(rng: random.Random, value, depth: int = 0):
    """The real value with junk inside it: a key's value, an element, or the whole of it."""
    if isinstance(value, dict) and value and depth < 4 and rng.random() < 0.8:
        key = rng.choice(list(value))
        out = dict(value)
        roll = rng.random()
        if roll < 0.15:
            del out[key]
        elif roll < 0.25:
            out[rng.choice(["\x00", "junk", HUGE[:50]])] = junk(rng)
        else:
            out[key] = mutate(rng, value[key], depth + 1)
        return out
    if isinstance(value, list) and value and depth < 4 and rng.random() < 0.8:
        out = list(value)
        index = rng.randrange(len(out))
        out[index] = mutate(rng, out[index], depth + 1) if rng.random() < 0.7 else junk(rng)
        return out
    return junk(rng)


def _slots(body: dict) -> list[tuple[str, int, int | None]]:
    """Every value of a request: (inputs or state, position, index in an ALL list or None)."""
    out = []
    for part in ("inputs", "state"):
        for pos, item in enumerate(body[part]):
            if isinstance(item, list):
                out += [(part, pos, k) for k in range(len(item))]
            else:
                out.append((part, pos, None))
    return out


def _set(body: dict, slot: tuple[str, int, int | None], change) -> None:
    part, pos, index = slot
    item = body[part][pos] if index is None else body[part][pos][index]
    item["value"] = change(item.get("value"))


def junk_bodies(rng: random.Random, components: Components, callback: dict, count: int) -> list[tuple[str, dict]]:
    """`count` requests shaped as the browser's, with junk values: (what was done, body)."""
    out = []
    for n in range(count):
        body = request_body(components, callback)
        slots = _slots(body)
        style = n % 5
        if not slots:
            body["changedPropIds"] = [rng.choice(["\x00", "x.y", HUGE[:100]])]
            out.append(("changed ids", body))
            continue
        if style == 0:  # each value in turn, each junk in turn
            slot = slots[(n // 5) % len(slots)]
            value = JUNK[(n // 5 // len(slots) + n) % len(JUNK)]
            _set(body, slot, lambda _v, value=value: value)
            out.append((f"{slot} = {str(value)[:40]!r}", body))
        elif style == 1:  # every value junk
            for slot in slots:
                _set(body, slot, lambda _v: junk(rng))
            out.append(("all junk", body))
        elif style in (2, 3):  # the real values with junk inside
            for slot in rng.sample(slots, k=min(len(slots), rng.randint(1, 3))):
                _set(body, slot, lambda v: mutate(rng, v))
            out.append(("mutated", body))
        else:  # extra keys anywhere, an ALL list emptied or given a stranger
            body[rng.choice(["extra", "\x00", "inputs2"])] = junk(rng)
            part, pos, _ = rng.choice(slots)
            item = body[part][pos]
            if isinstance(item, list):
                body[part][pos] = [] if rng.random() < 0.5 else item + [{**(item[0] if item else {}), "value": junk(rng)}]
            else:
                item[rng.choice(["extra", "value2"])] = junk(rng)
            out.append(("extra keys", body))
    return out


def malformed_bodies(rng: random.Random, components: Components, callback: dict, clientside: list[str]) -> list[tuple[str, bytes | None, dict | None]]:
    """Requests no browser sends: (what is wrong, raw bytes or None, body or None)."""
    good = request_body(components, callback)
    out: list[tuple[str, bytes | None, dict | None]] = [
        ("not JSON", b"{not json", None),
        ("empty", b"", None),
        ("a list", b"[1, 2]", None),
        ("a number", b"5", None),
        ("null", b"null", None),
        ("a string", b'"x"', None),
    ]
    out += [(f"no {k}", None, {x: v for x, v in good.items() if x != k}) for k in ("output", "inputs")]
    out += [(f"{k} = {v!r}", None, {**good, k: v}) for k in ("output", "inputs", "state", "outputs", "changedPropIds") for v in (None, 5, "x", {"a": 1})]
    out += [("unknown output", None, {**good, "output": "nope.children"}), ("clientside output", None, {**good, "output": rng.choice(clientside)})]
    if good["inputs"]:
        out += [
            ("an input missing", None, {**good, "inputs": good["inputs"][:-1]}),
            ("an input too many", None, {**good, "inputs": good["inputs"] + good["inputs"][:1]}),
        ]
        out += [("an input not an object", None, {**good, "inputs": [5, *good["inputs"][1:]]})]
        first = good["inputs"][0]
        items = first if isinstance(first, list) else [first]
        for broken in ({"value": 1}, {"id": None, "property": "value"}, {"id": {"a": 1}, "property": 5}, {"id": "other-id", "property": "value"}):
            out.append((f"input item {broken}", None, {**good, "inputs": [[broken] if isinstance(first, list) else broken, *good["inputs"][1:]]}))
        if items:
            shape = items[0] if isinstance(first, list) else [items[0]]  # an ALL input sent as one item, a plain one as a list
            out.append(("an input of the wrong shape", None, {**good, "inputs": [shape, *good["inputs"][1:]]}))
    if callback["output"].startswith(".."):
        out.append(("an output missing", None, {**good, "outputs": good["outputs"][:-1]}))
    return out


def answered(callback: dict, response: requests.Response) -> bool:
    """200 or 204; for Dash's page router, also a 400 saying that what came is not an address."""
    if response.status_code in OK:
        return True
    router = any(d["id"] == "_pages_location" for d in callback["inputs"])
    return router and response.status_code == 400 and response.json() == NOT_AN_ADDRESS


def test_every_callback_answers_junk_without_a_500(served, app_callbacks):
    callbacks, components = app_callbacks
    deps = served["session"].get(served["base"] + "_dash-dependencies", timeout=60).json()
    clientside = [d["output"] for d in deps if d.get("clientside_function")]
    assert len(callbacks) >= 10 and clientside, "the dashboard's callback list"
    rng = random.Random(SEED)
    per_callback = -(-POSTS // len(callbacks))
    errors: dict[str, list[str]] = {"junk": [], "malformed": []}
    statuses: Counter = Counter()
    posted = Counter()
    for callback in callbacks:
        for what, body in junk_bodies(rng, components, callback, per_callback):
            response = post(served, body)
            statuses[response.status_code] += 1
            posted[callback["output"]] += 1
            if not answered(callback, response):
                errors["junk"].append(f"{response.status_code} {callback['output'][:60]} {what}")
            elif response.status_code == 200:
                assert "response" in response.json(), (callback["output"], what)
        for what, raw, body in malformed_bodies(rng, components, callback, clientside):
            response = post(served, body, raw)
            statuses[response.status_code] += 1
            if not 400 <= response.status_code < 500:
                errors["malformed"].append(f"{response.status_code} {callback['output'][:60]} {what}")
    failed = errors["junk"] + errors["malformed"]
    print(f"{sum(statuses.values())} posts to {len(callbacks)} callbacks: {dict(statuses)}; not answered: {len(errors['junk'])} of {sum(posted.values())} junk, "
          f"{len(errors['malformed'])} malformed")  # fmt: skip
    assert sum(posted.values()) >= 1500 and all(n >= per_callback for n in posted.values())
    assert not failed, f"{len(failed)} answers were not 200/204 (junk) or 4xx (malformed):\n" + "\n".join(failed[:40])


def test_a_malformed_request_names_what_is_wrong(served):
    response = post(served, [1, 2])
    assert response.status_code == 400
    assert response.json() == {"error": "a callback request is a JSON object with output, outputs, inputs and changedPropIds"}


def test_a_body_of_megabytes_is_refused_unread_and_the_server_answers_the_next_request(served):
    """Anyone who can reach the dashboard can post a body of gigabytes to /_dash-update-component, which a worker read
    and parsed whole (a 9 MB one was answered 400 only after that). Past RADT_REQUEST_BODY_MB (8) it is a 413 with one
    line, before it is read. A body sent in chunks without a length is not read at all (Werkzeug, under its server and
    gunicorn alike): a 4xx."""
    from radt.settings import REQUEST_BODY_MB

    said = post(served, {"output": "x" * 9_000_000})
    assert said.status_code == 413, said.text[:200]
    assert said.json() == {"error": f"the request body is over {REQUEST_BODY_MB.default:g} MB (RADT_REQUEST_BODY_MB)"}
    chunked = served["session"].post(
        served["base"] + UPDATE, data=(b"x" * 1_000_000 for _ in range(9)), headers={"Content-Type": "application/json"}, timeout=120
    )
    assert chunked.status_code in (400, 413), chunked.text[:200]
    assert served["session"].get(served["base"], timeout=60).status_code == 200
    assert post(served, [1, 2]).status_code == 400, "an ordinary malformed request is still read and answered"


def test_every_response_forbids_sniffing_and_keeps_its_address_to_itself(served):
    """A run's log is served as text/plain (a shared folder: anyone may write it); without nosniff a browser may read
    one that holds HTML as a page of the dashboard's own. Pages, callbacks, assets and 404s alike."""
    session, base = served["session"], served["base"]
    answers = [session.get(base, timeout=60), session.get(base + "assets/charts.js", timeout=60), session.get(base + "no-such-page/x.js", timeout=60)]
    answers.append(post(served, [1, 2]))
    for answer in answers:
        assert answer.headers.get("X-Content-Type-Options") == "nosniff", (answer.url, answer.status_code, dict(answer.headers))
        assert answer.headers.get("Referrer-Policy") == "same-origin", answer.url
        # another site's page may not frame the dashboard and lay its own buttons over it (tests/test_framing_browser.py)
        # and no script but the dashboard's own files and the inline ones Dash wrote (tests/test_script_policy_browser.py)
        policy = answer.headers.get("Content-Security-Policy", "")
        assert policy.startswith("frame-ancestors 'self'; object-src 'none'; base-uri 'self'; script-src 'self' 'sha256-"), answer.url
        assert "unsafe" not in policy and policy == answers[0].headers["Content-Security-Policy"], answer.url
        assert answer.headers.get("X-Frame-Options") == "SAMEORIGIN", answer.url
