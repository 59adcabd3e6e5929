"""A figure as PNG, SVG or PDF through kaleido: one Chromium kept per process, the PNG's DPI and the PDF's title written in.

Static images need a Chromium: kaleido drives `BROWSER_PATH`, else /usr/bin/chromium, else whatever Chrome it finds on PATH."""

from __future__ import annotations

import atexit
import inspect
import io
import logging
import math
import os
import shutil
import struct
import threading
import warnings
import zlib

import plotly.graph_objects as go

from radt.app.export.exportoptions import ExportError
from radt.app.export.restyle import CSS_DPI

MAX_PIXELS = 50_000_000  # a PNG's width × height: 2400 dpi on a tall figure would take the server gigabytes of memory


def chromium() -> str:
    """The browser kaleido will drive; ExportError naming the fix when there is none."""
    path = os.environ.get("BROWSER_PATH")
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ExportError(f"BROWSER_PATH={path} is not an executable; point it at Chromium or Chrome, or unset it")
        return path
    for candidate in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = candidate if os.path.isabs(candidate) and os.access(candidate, os.X_OK) else shutil.which(candidate)
        if found:
            return found
    raise ExportError(
        "PNG, SVG and PDF need Chromium or Chrome: install it (Debian: apt install chromium) or set BROWSER_PATH=/path/to/chrome; CSV needs neither"
    )


_KALEIDO = threading.Lock()
_kaleido_running = False


def _kaleido_server() -> None:
    """One Chromium kept for every export of this process: 4 s to start, 0.4 s an image after that."""
    global _kaleido_running
    with _KALEIDO:
        if not _kaleido_running:
            import kaleido

            _quiet_browser_logs()
            _pdf_without_margins()
            kaleido.start_sync_server(silence_warnings=True)
            atexit.register(kaleido.stop_sync_server, silence_warnings=True)
            _kaleido_running = True


PDF_PRINT = {"printBackground": True, "preferCSSPageSize": True, "pageRanges": "1"} | dict.fromkeys(
    ("marginTop", "marginBottom", "marginLeft", "marginRight"), 0
)


def _pdf_without_margins() -> None:
    """kaleido prints a PDF on a page of the figure's size with Chromium's 0.1 in margins (its one Page.printToPDF call),
    so Chromium shrank the figure 5 % to fit (9 pt text as 8.5 pt) into the page's top left: a 3.5 × 9 in figure ended in
    0.4 in of blank. Printed without margins, the page is the figure at its size. Left as it is where kaleido changed."""
    try:
        from kaleido._kaleido_tab import _devtools_utils as devtools

        raise_error = devtools._raise_error
        if list(inspect.signature(devtools.print_pdf).parameters) != ["tab"]:  # another kaleido's call: not ours to replace
            return
    except (ImportError, AttributeError, TypeError, ValueError):
        return

    async def print_pdf(tab) -> str:
        response = await tab.send_command("Page.printToPDF", params=PDF_PRINT)
        raise_error(response)
        return response.get("result", {}).get("data")

    devtools.print_pdf = print_pdf


def _kaleido_restart() -> None:
    """After a failure the browser may be gone: the next export starts a new one."""
    global _kaleido_running
    with _KALEIDO:
        if _kaleido_running:
            import kaleido

            kaleido.stop_sync_server(silence_warnings=True)
            _kaleido_running = False


def image_bytes(figure: go.Figure, fmt: str, dpi: int) -> bytes:
    """PNG at `dpi` (width in pixels = inches × dpi), or SVG/PDF at the figure's size in inches."""
    scale = dpi / CSS_DPI if fmt == "png" else 1
    if fmt == "png":
        width, height = round((figure.layout.width or 700) * scale), round((figure.layout.height or 500) * scale)
        if width * height > MAX_PIXELS:
            fits = math.floor(dpi * math.sqrt(MAX_PIXELS / (width * height)))
            raise ExportError(
                f"a PNG of {width} × {height} pixels ({width * height / 1e6:.0f} MP) at {dpi} DPI is over the {MAX_PIXELS // 1_000_000} MP limit; "
                f"use {fits} DPI or less, fewer charts, or SVG/PDF (sharp at any size)"
            )
    os.environ.setdefault("BROWSER_PATH", chromium())
    try:
        _kaleido_server()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")
            image = figure.to_image(format=fmt, scale=scale)
    except Exception as exc:  # kaleido's browser failed to start or crashed
        _kaleido_restart()
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ExportError(f"rendering the {fmt.upper()} with {os.environ['BROWSER_PATH']} failed ({reason}); set BROWSER_PATH to a working Chromium") from exc
    meta = figure.layout.meta
    title = meta.get("title") if isinstance(meta, dict) else None
    if fmt == "png":
        return with_png_dpi(image, dpi)
    return with_pdf_title(image, title) if fmt == "pdf" and title else image


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def with_png_dpi(png: bytes, dpi: int) -> bytes:
    """The PNG with its resolution recorded (a pHYs chunk, pixels per metre): LaTeX, Word and Inkscape then place a
    300 DPI export at its inches; without it they take 72 or 96 DPI and draw it three to four times too large."""
    if not png.startswith(PNG_SIGNATURE) or b"pHYs" in png[: png.find(b"IDAT")]:
        return png
    per_metre = round(dpi / 0.0254)
    body = b"pHYs" + struct.pack(">IIB", per_metre, per_metre, 1)
    chunk = struct.pack(">I", 9) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    header_end = len(PNG_SIGNATURE) + 8 + 13 + 4  # the IHDR chunk: length, type, 13 bytes, CRC
    return png[:header_end] + chunk + png[header_end:]


def with_pdf_title(pdf: bytes, title: str) -> bytes:
    """The PDF with its document title set (kaleido leaves its own, "Kaleido-fier"), and radt as its creator."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    writer.add_metadata({"/Title": title, "/Creator": "radt export", "/Producer": "radt export (Plotly, kaleido, pypdf)"})
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


BROWSER_LOGGERS = ("kaleido", "choreographer", "logistro")


def _quiet_browser_logs() -> None:
    """Keep kaleido's and choreographer's logging (browser JSON, tracebacks as the browser closes at exit) off the user's terminal:
    a failed image is reported once, as an ExportError."""
    for name in BROWSER_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.CRITICAL + 1)
        logger.propagate = False
