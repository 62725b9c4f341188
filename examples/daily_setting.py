"""An app that reports one setting a day: which colour theme its user chose.

Run it at every start of the app (here: once per invocation). It makes at most one
report of the metric per collection window (a day), however often it runs; a report
made while offline waits in the app's directory and leaves at a later start::

    crowdmix config export --shuffler shuffler.example:7400 --token-file app-token.txt \\
        --out crowdmix-config.pb                      # once, when the app is built
    python examples/daily_setting.py --app-dir ~/.local/share/myapp/crowdmix \\
        --shuffler shuffler.example:7400 --token-file app-token.txt \\
        --config crowdmix-config.pb --theme dark

The app names the metric and the value; the params, the collection window and the
aggregator's public key come from the shuffler (``GetConfig``), or from the config
bundled with the app until the shuffler is reached. What it prints is for the
reader of this example; an app would say nothing.
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
    ap.add_argument(
        "--config", type=Path, help="the config bundled with the app (crowdmix config export)"
    )
    ap.add_argument("--theme", required=True, help="the setting to report, e.g. dark")
    args = ap.parse_args(argv)
    try:
        APP_TOKEN = args.token_file.read_text().strip()
    except OSError as exc:
        print(f"daily_setting: cannot read {args.token_file}: {exc.strerror}", file=sys.stderr)
        return 2
    APP_DIR, SHUFFLER, BUNDLED_CONFIG, theme = args.app_dir, args.shuffler, args.config, args.theme
    roots = args.ca.read_bytes() if args.ca else None

    try:
        reporter = client.Reporter(
            APP_DIR,
            SHUFFLER,
            token=APP_TOKEN,
            tls=not args.insecure,
            root_certificates=roots,
            bundled_config=BUNDLED_CONFIG,
        )
    except (client.CrowdmixClientError, ValueError) as exc:  # a bad target, an unusable dir
        print(f"daily_setting: {exc}", file=sys.stderr)
        return 2
    # -- what the README walks through: from here on nothing raises ------------------
    try:
        result = reporter.report("theme", theme)  # CLAIMED, ALREADY_REPORTED_THIS_WINDOW, ...
        left = reporter.flush(timeout=2.0)  # at exit: how many wait for a later start
    finally:
        reporter.close()
    # ---------------------------------------------------------------------------------

    status = result.status
    if status is client.ReportStatus.INVALID_VALUE:  # the user's input: say it, fail
        print(f"daily_setting: {result.detail}", file=sys.stderr)
        return 2
    if result:
        print("reported theme for this window")
    elif status is client.ReportStatus.ALREADY_REPORTED_THIS_WINDOW:
        print("no new report: this window's theme report is made")
    elif status is client.ReportStatus.NO_CONFIG:
        print(f"no config yet, no report made: bundle one with --config ({reporter.last_error})")
    else:
        print(f"no report made: {status.value}: {result.detail}")
    print(f"{left} report(s) waiting to be sent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
