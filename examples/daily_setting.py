"""An app that reports one setting a day: which colour theme its user chose.

Run it at every start of the app (here: once per invocation). It makes at most one
report of the metric per collection window (a day), however often it runs; a report
made while offline waits in the app's directory and leaves at a later start::

    python examples/daily_setting.py --app-dir ~/.local/share/myapp/crowdmix \\
        --shuffler shuffler.example:7400 --token-file app-token.txt --theme dark

The app names the metric and the value; the params, the collection window and the
aggregator's public key come from the shuffler (``GetConfig``). What it prints is
for the reader of this example; an app would say nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from crowdmix import client


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app-dir", type=Path, required=True, help="the app's private storage")
    ap.add_argument("--shuffler", required=True, help="HOST:PORT of the shuffler")
    ap.add_argument("--token-file", type=Path, required=True, help="the app's bearer token")
    ap.add_argument("--ca", type=Path, help="PEM root certificates (default: the system's)")
    ap.add_argument("--insecure", action="store_true", help="no TLS (a local test cluster)")
    ap.add_argument("--theme", required=True, help="the setting to report, e.g. dark")
    args = ap.parse_args(argv)
    try:
        APP_TOKEN = args.token_file.read_text().strip()
    except OSError as exc:
        print(f"daily_setting: cannot read {args.token_file}: {exc.strerror}", file=sys.stderr)
        return 2
    APP_DIR, SHUFFLER, theme = args.app_dir, args.shuffler, args.theme
    roots = args.ca.read_bytes() if args.ca else None

    try:
        # -- what the README walks through --------------------------------------
        reporter = client.Reporter(
            APP_DIR, SHUFFLER, token=APP_TOKEN, tls=not args.insecure, root_certificates=roots
        )
        try:
            made = reporter.report("theme", theme)  # True: today's report is made and queued
            left = reporter.flush(timeout=2.0)  # at exit: how many wait for a later start
            reached = reporter.config() is not None  # the shuffler answered at least once
        finally:
            reporter.close()
        # -----------------------------------------------------------------------
    except (client.CrowdmixClientError, ValueError) as exc:  # a bad theme, an unusable dir
        print(f"daily_setting: {exc}", file=sys.stderr)
        return 2

    if made:
        print("reported theme for this window")
    elif not reached:
        print(f"could not reach the shuffler yet ({reporter.last_error}); no report made")
    else:
        print("no new report: this window's theme report is made (or still waiting)")
    print(f"{left} report(s) waiting to be sent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
