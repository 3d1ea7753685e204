"""A headless Chromium that draws a page and does nothing else: no JavaScript, no network, and
its own sandbox on.

``labs render`` screenshots pages built from students' work (feedback pages) on the
instructor's machine, so the browser is configured as if each page were hostile:

* **JavaScript off** through the profile's content setting (``javascript: 2``, "block"), which
  headless Chromium honours for screenshots and PDFs (``--blink-settings=scriptEnabled=false``
  makes headless screenshots fail silently);
* **no network**: every request, loopback included (``--proxy-bypass-list=<-loopback>``), goes to
  a proxy on a closed local port and every host name resolves to nothing; ``file:`` pages read
  nothing beside them, since the page is copied alone into a fresh folder;
* **Chromium's sandbox on**: it refuses to start as root without ``--no-sandbox``, so as root the
  browser runs as the unprivileged ``nobody`` user (``setpriv``), where its namespace sandbox
  starts (user namespaces, as bubblewrap uses). Where neither works, nothing is drawn and
  :func:`screenshot` says why: a rendering aid never runs unsandboxed.

Reference: Chromium's ``--headless``, ``--screenshot``, ``--print-to-pdf``, ``--proxy-server``,
``--host-resolver-rules`` switches and its Linux sandbox design (Chromium's own "Linux
Sandboxing" document).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["browser", "chromium_command", "screenshot"]

#: Where every request goes: nothing listens on the discard port of loopback.
_CLOSED_PROXY = "127.0.0.1:9"
_PREFERENCES = {"profile": {"default_content_setting_values": {"javascript": 2}}}
_UNPRIVILEGED = "nobody"


def browser() -> str | None:
    """A headless-capable Chromium on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_command(executable: str, profile: Path, *args: str) -> list[str]:
    """Chromium's command line: headless, sandboxed, offline, ``profile`` (see :func:`_profile`)."""
    return [
        executable,
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        f"--proxy-server={_CLOSED_PROXY}",
        "--proxy-bypass-list=<-loopback>",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        *args,
    ]


def _profile(folder: Path) -> Path:
    """A fresh Chromium profile in ``folder`` whose content settings block JavaScript."""
    profile = folder / "profile"
    (profile / "Default").mkdir(parents=True)
    (profile / "Default" / "Preferences").write_text(json.dumps(_PREFERENCES))
    return profile


def _as_unprivileged(folder: Path) -> list[str] | None:
    """The prefix that runs a command as ``nobody`` (``folder`` handed to it), ``[]`` when not
    root, or None where root cannot drop to it (no such user, no ``setpriv``)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    try:
        user = pwd.getpwnam(_UNPRIVILEGED)
    except KeyError:
        return None
    if setpriv is None:
        return None
    for path in [folder, *folder.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
    return [setpriv, f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


def screenshot(html: Path, png: Path | None = None, pdf: Path | None = None) -> list[Path]:
    """The top of ``html`` as ``png`` (1280 px wide) and all of it as ``pdf``.

    Returns the files written: none where no Chromium is installed, it cannot start sandboxed
    (a line on stderr says so), or it fails; drawing is an aid, never a reason to fail.
    """
    executable = browser()
    if executable is None:
        return []
    written = []
    with tempfile.TemporaryDirectory(prefix="tlab-browser-") as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)
        page = folder / "page.html"
        shutil.copyfile(html, page)
        profile = _profile(folder)
        prefix = _as_unprivileged(folder)
        if prefix is None:
            print(
                f"not drawing {html}: Chromium's sandbox needs an unprivileged user, and "
                f"'{_UNPRIVILEGED}' or setpriv is missing",
                file=sys.stderr,
            )
            return []
        env = {**os.environ, "HOME": str(folder)}
        jobs = {
            png: ["--screenshot=" + str(folder / "page.png"), "--window-size=1280,12000"],
            pdf: ["--print-to-pdf=" + str(folder / "page.pdf"), "--no-pdf-header-footer"],
        }
        for target, args in jobs.items():
            if target is None:
                continue
            made = folder / Path(args[0].split("=", 1)[1]).name
            command = [*prefix, *chromium_command(executable, profile, *args, page.as_uri())]
            try:
                run = subprocess.run(command, capture_output=True, timeout=180, env=env)
            except (OSError, subprocess.TimeoutExpired):
                continue
            if made.is_file() and made.stat().st_size > 0:
                shutil.copyfile(made, target)
                written.append(target)
            elif b"sandbox" in run.stderr.lower():
                print(f"not drawing {html}: Chromium's sandbox did not start", file=sys.stderr)
    return written
