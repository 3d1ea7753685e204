"""``labs render``'s browser draws a hostile page and does nothing else: no script runs, nothing
is fetched (not even from loopback), and Chromium keeps its sandbox.

The page here is *not* sanitised (that is :mod:`tests.test_feedback`'s part): it holds scripts,
remote images, style sheets, frames and a fetch, all aimed at a loopback server that counts
requests. A control draws the same page in a plain headless Chromium to show that the page does
run and fetch there, so the assertions can fail.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import LoopbackServer

from transformer_lab.grading import browser

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(browser.browser() is None, reason="no Chromium installed"),
]
RED = (255, 0, 0)


def _hostile(base: str) -> str:
    """A page whose script paints it red and whose every resource is on ``base``."""
    return f"""<!DOCTYPE html><html><head><title>untouched</title>
<link rel="stylesheet" href="{base}/style.css">
<style>@import url({base}/import.css); h2 {{ background: url({base}/bg.png); }}</style>
</head><body style="background: rgb(255, 255, 255)">
<h1 id="h">nothing ran</h1><h2>x</h2>
<img src="{base}/img.png" width="20" height="20"><iframe src="{base}/frame.html"></iframe>
<script>
document.title = "pwned";
document.body.style.background = "rgb(255, 0, 0)";
document.getElementById("h").textContent = "SCRIPT RAN";
fetch("{base}/fetch");
</script>
<script src="{base}/script.js"></script>
</body></html>"""


def _red_pixels(png: Path) -> int:
    from PIL import Image

    with Image.open(png) as image:  # the top of the page: where the heading and script are
        top = image.convert("RGB").crop((0, 0, image.width, min(image.height, 300)))
        return sum(1 for p in top.getdata() if p == RED)


def _plain_chromium(page: Path, png: Path) -> None:
    """The control: the same page in an ordinary headless Chromium (JavaScript on, network on),
    sandboxed the same way, so only the two settings under test differ."""
    with tempfile.TemporaryDirectory(prefix="tlab-control-") as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)
        shutil.copyfile(page, folder / "page.html")
        prefix = browser._as_unprivileged(folder)
        assert prefix is not None
        shot = [f"--screenshot={folder / 'page.png'}", "--window-size=400,300"]
        command = browser.chromium_command(
            browser.browser(), folder / "profile", *shot, (folder / "page.html").as_uri()
        )
        command = [*prefix, *(a for a in command if not a.startswith(("--proxy", "--host-res")))]
        command.insert(-1, "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
        subprocess.run(command, capture_output=True, timeout=180, env={"HOME": str(folder)})
        shutil.copyfile(folder / "page.png", png)


def test_a_hostile_page_is_drawn_with_nothing_run_or_fetched(tmp_path: Path) -> None:
    with LoopbackServer(b"body { background: rgb(255, 0, 0) }", "text/css") as server:
        base = server.url.rsplit("/", 1)[0]
        page = tmp_path / "hostile.html"
        page.write_text(_hostile(base))
        written = browser.screenshot(page, tmp_path / "hostile.png", tmp_path / "hostile.pdf")
        fetched_by_render = list(server.paths)
        _plain_chromium(page, tmp_path / "control.png")
        fetched_by_control = list(server.paths[len(fetched_by_render) :])
    assert written == [tmp_path / "hostile.png", tmp_path / "hostile.pdf"]
    assert (tmp_path / "hostile.pdf").read_bytes()[:5] == b"%PDF-"
    assert fetched_by_render == []
    assert _red_pixels(tmp_path / "hostile.png") == 0  # the script would paint it all red
    # The control: an ordinary browser runs the script and fetches from loopback.
    assert _red_pixels(tmp_path / "control.png") > 1000
    assert "/fetch" in fetched_by_control or "/img.png" in fetched_by_control


def test_chromium_keeps_its_sandbox() -> None:
    command = browser.chromium_command("chromium", Path("/p"), "--screenshot=x")
    assert "--no-sandbox" not in command
    assert "--proxy-bypass-list=<-loopback>" in command
