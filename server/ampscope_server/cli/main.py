"""`ampscope serve [--host --port --db]`, `ampscope db upgrade [--db]`,
`ampscope report RUN [--baseline RUN] [--db URL] [--html PATH]` (the Markdown post-mortem of
`findings.reads`, optionally the HTML report with findings) and
`ampscope sync PATH [--server URL] [--token]` (uploads a client's disk spool; the logic is the
client's, `ampscope.sync`, imported lazily and torch-free), and the team-mode commands
`ampscope token …` and `ampscope runs …` (`cli.admin`), and `ampscope alerts …` (`cli.alerts`).

`serve --auth auto` (the default) requires a token unless the server binds to loopback only;
binding beyond loopback without auth takes `--insecure-no-auth` and says so loudly.

`serve` on SQLite brings the schema to the Alembic head itself; on Postgres it refuses to start
until `ampscope db upgrade` has been run (migrations there are an operator's decision).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ampscope_server.cli import admin as cli_admin
from ampscope_server.cli import alerts as cli_alerts
from ampscope_server.config import DB_HELP, Settings, auth_required, is_loopback

DEFAULT_SERVER = "http://127.0.0.1:8765"


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not between 1 and 65535")
    return port


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ampscope", description="ampscope server")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the dashboard and ingest server")
    serve.add_argument("--host", help="interface to bind (default 127.0.0.1, AMPSCOPE_HOST)")
    serve.add_argument("--port", type=_port, help="port (default 8765, AMPSCOPE_PORT)")
    serve.add_argument("--db", help=DB_HELP)
    serve.add_argument("--auth", choices=["required", "auto"],
                       help="require a token (auto: unless bound to loopback only; AMPSCOPE_AUTH)")
    serve.add_argument("--insecure-no-auth", action="store_true", default=None,
                       help="serve beyond loopback with no access control (a trusted network)")
    serve.add_argument("--allowed-hosts",
                       help="Host names this server answers to, comma-separated, or * "
                            "(AMPSCOPE_ALLOWED_HOSTS; loopback names are always allowed)")
    serve.add_argument("--workers", type=int, default=1,
                       help="worker processes (Postgres only; live updates cross them through "
                            "LISTEN/NOTIFY; default 1)")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn's log level; below info the access log is off (default info)")

    db = commands.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="migrate the schema to the latest revision")
    upgrade.add_argument("--db", help=DB_HELP)

    sync = commands.add_parser(
        "sync", help="upload a client spool (a directory or one .ampspool file) to a server")
    sync.add_argument("path", help="spool directory or file")
    sync.add_argument("--server", default=os.environ.get("AMPSCOPE_SERVER", DEFAULT_SERVER),
                      help=f"server URL (default $AMPSCOPE_SERVER or {DEFAULT_SERVER})")
    sync.add_argument("--token-file", metavar="PATH",
                      help="read the ingest token from this file (default: $AMPSCOPE_TOKEN); "
                           "never pass a secret as an argument, `ps` shows it")

    report = commands.add_parser(
        "report", help="print a run's Markdown post-mortem (findings, key numbers, advice)")
    report.add_argument("run", help="run id, its first 8 or more characters, or its name")
    report.add_argument("--baseline", help="a run to compare with (e.g. the FP32 run), named "
                                           "the same ways")
    report.add_argument("--db", help=DB_HELP)
    report.add_argument("--html", metavar="PATH",
                        help="also write the self-contained HTML report, findings first")
    cli_admin.add_parsers(commands)
    cli_alerts.add_parsers(commands)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {
        key: value
        for key, value in (("db_url", args.db), ("host", getattr(args, "host", None)),
                           ("port", getattr(args, "port", None)),
                           ("auth", getattr(args, "auth", None)),
                           ("insecure_no_auth", getattr(args, "insecure_no_auth", None)),
                           ("allowed_hosts", getattr(args, "allowed_hosts", None)))
        if value is not None
    }
    return Settings(**overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "sync":
        return _sync(args.path, args.server, args.token_file)
    settings = _settings(args)
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    from ampscope_server.store import db

    try:
        return _dispatch(args, settings)
    except (ArgumentError, NoSuchModuleError) as exc:
        sys.stderr.write(f"ampscope: the database URL {settings.db_url!r} is not one SQLAlchemy "
                         f"can use ({exc}); e.g. sqlite:///runs.db or "
                         "postgresql+psycopg://user@host/db\n")
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        sys.stderr.write(f"ampscope: cannot reach the database {db.safe_url(settings.db_url)}: "
                         f"{reason}\n")
    return 2


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from ampscope_server.store import db

    if args.command in ("token", "runs"):
        return cli_admin.run(args, settings)
    if args.command == "alerts":
        return cli_alerts.run(args, settings)
    if args.command == "report":
        return _report(settings, args.run, args.baseline, args.html)
    if args.command == "db":
        db.upgrade(settings.db_url)
        sys.stderr.write(f"ampscope: {db.safe_url(settings.db_url)} is at revision "
                         f"{db.head_revision()}\n")
        return 0
    return _serve(settings, args.log_level, args.workers)


def _sync(path: str, server: str, token_file: str | None) -> int:
    """Exit 0 when every readable frame was taken (accepted or a duplicate), 1 when the server
    refused or never took some, 2 when PATH or the URL is unusable. Damaged stretches (a truncated
    tail after a kill) are reported but do not fail the run: the good frames were delivered."""
    from ampscope.sync import sync

    try:
        token = (Path(token_file).read_text(encoding="utf-8").strip() if token_file
                 else os.environ.get("AMPSCOPE_TOKEN") or None)
        report = sync(path, server, token=token)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"ampscope sync: {exc}\n")
        return 2
    sys.stdout.write(f"ampscope sync: {report.summary()}\n")
    return 0 if report.ok else 1


def _report(settings: Settings, run_id: str, baseline: str | None, html_path: str | None) -> int:
    """Exit 0 with the Markdown on stdout; 2 (a message on stderr) for an unknown run or
    baseline, a database without the current schema, or an HTML path that cannot be written."""
    from ampscope_server.errors import AmpscopeError
    from ampscope_server.export import report as export_report
    from ampscope_server.findings import reads as finding_reads
    from ampscope_server.runs import reads as runs
    from ampscope_server.store import db

    try:
        db.require_existing(settings.db_url)
    except AmpscopeError as exc:
        sys.stderr.write(f"ampscope report: {exc.message}\n")
        return 2
    engine = db.make_engine(settings.db_url)
    try:
        db.verify_schema(engine)
        with db.make_session_factory(engine)() as session:
            run = runs.resolve_run(session, run_id)
            if baseline is not None:
                baseline = runs.resolve_run(session, baseline).id
            text, findings = finding_reads.report_markdown(session, run, baseline)
            page = (None if html_path is None else
                    export_report.report_html_of(
                        session, run, settings.crash_timeout_s, findings)[0])
    except AmpscopeError as exc:
        sys.stderr.write(f"ampscope report: {exc.message}\n")
        return 2
    finally:
        engine.dispose()
    if html_path is not None and page is not None:
        try:
            Path(html_path).write_text(page, encoding="utf-8")
        except OSError as exc:
            sys.stderr.write(f"ampscope report: cannot write {html_path}: {exc.strerror}\n")
            return 2
        sys.stderr.write(f"ampscope report: wrote {html_path}\n")
    sys.stdout.write(text)
    return 0


def _serve(settings: Settings, log_level: str, workers: int = 1) -> int:
    from ampscope_server.cli import serving
    from ampscope_server.errors import SchemaNotCurrent
    from ampscope_server.store import db

    if workers < 1:
        sys.stderr.write(f"ampscope serve: --workers must be at least 1, not {workers}\n")
        return 2
    if workers > 1 and db.is_sqlite(settings.db_url):
        sys.stderr.write("ampscope serve: SQLite is served by one process (one writer); "
                         "--workers needs Postgres (--db postgresql+psycopg://…)\n")
        return 2

    try:
        required = auth_required(settings)
    except ValueError as exc:
        sys.stderr.write(f"ampscope serve: {exc}\n")
        return 2
    if not required and not is_loopback(settings.host):
        sys.stderr.write(
            f"ampscope serve: WARNING: serving {settings.host}:{settings.port} with NO access "
            "control (--insecure-no-auth): anyone who can reach it can read, write and delete "
            "every run\n")

    busy = _cannot_listen(settings.host, settings.port)
    if busy is not None:
        sys.stderr.write(f"ampscope serve: cannot listen on {settings.host}:{settings.port}: "
                         f"{busy} (another server there? stop it, or pass --port N)\n")
        return 2
    if db.is_sqlite(settings.db_url):
        db.upgrade(settings.db_url)
    engine = db.make_engine(settings.db_url)
    try:
        db.verify_schema(engine)
    except SchemaNotCurrent as exc:
        sys.stderr.write(f"ampscope: {exc.message}\n")
        return 2
    finally:
        engine.dispose()
    serving.run(settings, log_level, workers)
    return 0


def _cannot_listen(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on (the OS's words), or None. uvicorn would find out
    too, in six lines of log and traceback; this says it in one, before anything starts (a
    server that takes the port in between still gets uvicorn's lines)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


if __name__ == "__main__":
    sys.exit(main())
