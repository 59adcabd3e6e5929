"""A callback request's shape is checked before Dash reads it: a body no browser sends (not an object, an unknown output,
inputs missing or of the wrong form) is a 400 with one line instead of a 500 from inside Dash, and a body over
RADT_REQUEST_BODY_MB a 413 before it is read, and a bundle path Dash does not serve a 404. The values in a well-formed
request are the callbacks' own to check (pages/*, radt.app.web.inputs); their errors stay errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import dash
from dash.exceptions import DependencyException
from flask import Flask, Response, jsonify, request

from radt.settings import REQUEST_BODY_MB

UPDATE = "_dash-update-component"
MALFORMED = "a callback request is a JSON object with output, outputs, inputs and changedPropIds"
NOT_AN_ADDRESS = "the page's address is not a path (/...) and a query string"
WILDCARDS = ("ALL", "MATCH", "ALLSMALLER")
# Dash's own page router reads the browser's address; anything else there is not an address (it would fail inside Dash)
ADDRESS: dict[tuple[str, str], Callable[[object], bool]] = {
    ("_pages_location", "pathname"): lambda v: v is None or (isinstance(v, str) and v.startswith("/")),
    ("_pages_location", "search"): lambda v: v is None or isinstance(v, str),
}


def install(server: Flask, app: dash.Dash) -> None:
    """Answer a malformed callback request with 400 and what is wrong, before Dash dispatches it."""
    path = app.config.routes_pathname_prefix + UPDATE

    server.config["MAX_CONTENT_LENGTH"] = int(REQUEST_BODY_MB.get() * 1_000_000)  # Werkzeug refuses a longer body unread

    @server.errorhandler(413)
    def _too_large(_error) -> tuple[Response, int]:
        return jsonify(error=f"the request body is over {REQUEST_BODY_MB.get():g} MB ({REQUEST_BODY_MB.name})"), 413

    # a bundle path no page asks for (a scanner's ../../etc/passwd, an unknown package, a stale fingerprint): Dash raises,
    # which was a 500 and a traceback listing every bundle path in the log, per request
    @server.errorhandler(DependencyException)
    def _no_such_bundle(_error) -> tuple[Response, int]:
        return Response("not found\n", mimetype="text/plain"), 404

    @server.before_request
    def _check_callback_request() -> Response | tuple[Response, int] | None:
        if request.method != "POST" or request.path != path:
            return None
        body = request.get_json(silent=True)  # parsed once: Dash reads the cached body
        problem = request_problem(body, app.callback_map)
        return (jsonify(error=problem), 400) if problem else None


def request_problem(body: object, callbacks: Mapping[str, dict]) -> str | None:
    """What makes `body` a request no browser sends for any of `callbacks`, or None."""
    if not isinstance(body, dict) or not isinstance(body.get("output"), str):
        return MALFORMED
    output = body["output"]
    callback = callbacks.get(output)
    if callback is None or "callback" not in callback:  # a clientside callback has no server function
        return f"no server callback has the output {_short(output)}"
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        return "changedPropIds is not a list of strings"
    for part in ("inputs", "state"):
        problem = _items_problem(body.get(part, [] if part == "state" else None), callback[part], part)
        if problem:
            return problem
    return _outputs_problem(body.get("outputs"), output)


def _items_problem(items: object, deps: list[dict], part: str) -> str | None:
    if not isinstance(items, list) or len(items) != len(deps):
        return f"{part} is not a list of {len(deps)} for this callback"
    for position, (item, dep) in enumerate(zip(items, deps, strict=True)):
        if not _fits(item, dep["id"], dep["property"]):
            return f"{part} {position} is not {dep['id']}.{dep['property']} in the form the browser sends"
        address = ADDRESS.get((dep["id"], dep["property"]))
        if address and not address(item.get("value")):
            return NOT_AN_ADDRESS
    return None


def _outputs_problem(outputs: object, output: str) -> str | None:
    specs = output[2:-2].split("...") if output.startswith("..") else [output]
    listed = outputs if output.startswith("..") else [outputs]
    if not isinstance(listed, list) or len(listed) != len(specs):
        return f"outputs is not the {len(specs)} output(s) of this callback"
    for item, spec in zip(listed, specs, strict=True):
        component, prop = spec.rsplit(".", 1)
        if not _fits(item, component, prop):
            return f"an output is not {_short(spec)}"
    return None


def _fits(item: object, declared: str, prop: str) -> bool:
    """Whether a request's item is the declared dependency: one {id, property} or, for ALL/ALLSMALLER, a list of them."""
    pattern = json.loads(declared) if declared.startswith("{") else None
    wildcard = _wildcard(pattern) if pattern else None
    if wildcard in ("ALL", "ALLSMALLER"):
        return isinstance(item, list) and all(_one(i, pattern, prop) for i in item)
    return _one(item, pattern if pattern else declared, prop)


def _one(item: object, declared: str | dict, prop: str) -> bool:
    if not isinstance(item, dict) or _name(item.get("property")) != _name(prop):
        return False
    if isinstance(declared, dict):
        found = item.get("id")
        if not isinstance(found, dict) or set(found) != set(declared):
            return False
        return all(isinstance(v, list) or found[k] == v for k, v in declared.items())
    return item.get("id") == declared


def _wildcard(pattern: dict) -> str | None:
    return next((v[0] for v in pattern.values() if isinstance(v, list) and v and v[0] in WILDCARDS), None)


def _name(prop: object) -> str:
    """A property without the @hash of an allow_duplicate output."""
    return prop.split("@")[0] if isinstance(prop, str) else ""


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")
