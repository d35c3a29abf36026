"""The team-mode commands of `ampscope` (`cli.py` parses; these run): tokens and run lifecycle.

    ampscope token create --project NAME | --all-projects --scope read|ingest|admin [--name L]
    ampscope token list
    ampscope token revoke ID
    ampscope runs delete ID
    ampscope runs prune --project NAME --older-than 30d [--dry-run]

Each works on the database directly (`--db`, AMPSCOPE_DB_URL), as an operator on the server's
machine does; `token create` prints the secret alone on stdout, once, and everything else on
stderr, so `TOKEN=$(ampscope token create …)` captures just the secret.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from sqlalchemy.orm import Session

from ampscope_server.config import DB_HELP, Settings

EXIT_USAGE = 2


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = commands.add_parser("token", help="API tokens: create, list, revoke")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    create = token_commands.add_parser("create", help="make a token; prints its secret once")
    where = create.add_mutually_exclusive_group(required=True)
    where.add_argument("--project", help="the project the token may read or write")
    where.add_argument("--all-projects", action="store_true", help="every project")
    create.add_argument("--scope", required=True, choices=["read", "ingest", "admin"],
                        help="read: dashboards; ingest: a training job (writes, reads nothing); "
                             "admin: everything, deleting runs included")
    create.add_argument("--name", default="", help="a label shown by `token list`")
    create.add_argument("--db", help=DB_HELP)
    listing = token_commands.add_parser("list", help="every token, never a secret")
    listing.add_argument("--db", help=DB_HELP)
    revoke = token_commands.add_parser("revoke", help="stop a token working (its sessions too)")
    revoke.add_argument("id", help="the token's id, as `token list` shows it")
    revoke.add_argument("--db", help=DB_HELP)

    runs = commands.add_parser("runs", help="run lifecycle: delete, prune")
    run_commands = runs.add_subparsers(dest="runs_command", required=True)
    delete = run_commands.add_parser("delete", help="delete a run and everything stored for it")
    delete.add_argument("id", help="run id, its first 8 or more characters, or its name")
    delete.add_argument("--db", help=DB_HELP)
    prune = run_commands.add_parser("prune", help="delete a project's runs idle for long")
    prune.add_argument("--project", required=True, help="the project whose runs are pruned")
    prune.add_argument("--older-than", required=True, metavar="AGE",
                       help="last ingest longer ago than this: 30d, 12h, 90m, 45s")
    prune.add_argument("--dry-run", action="store_true", help="list them, delete nothing")
    prune.add_argument("--db", help=DB_HELP)


def run(args: argparse.Namespace, settings: Settings) -> int:
    handlers: dict[tuple[str, str], Callable[[argparse.Namespace, Session], int]] = {
        ("token", "create"): _token_create, ("token", "list"): _token_list,
        ("token", "revoke"): _token_revoke, ("runs", "delete"): _runs_delete,
        ("runs", "prune"): _runs_prune,
    }
    sub = args.token_command if args.command == "token" else args.runs_command
    from ampscope_server.errors import AmpscopeError

    try:
        with session_for(settings) as session:
            return handlers[(args.command, sub)](args, session)
    except AmpscopeError as exc:
        sys.stderr.write(f"ampscope {args.command} {sub}: {exc.message}\n")
        return EXIT_USAGE


@contextmanager
def session_for(settings: Settings) -> Iterator[Session]:
    from ampscope_server.store import db

    db.require_existing(settings.db_url)
    engine = db.make_engine(settings.db_url)
    try:
        db.verify_schema(engine)
        with db.unit_of_work(db.make_session_factory(engine)) as session:
            yield session
    finally:
        engine.dispose()


def table(rows: Sequence[Sequence[str]]) -> None:
    """Print rows (the first is the header) as aligned columns on stdout."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                         .rstrip() + "\n")


def when(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds))


def _token_create(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.access import tokens
    from ampscope_server.access.principal import Scope

    project = None if args.all_projects else args.project
    created = tokens.create_token(session, Scope(args.scope), project, args.name)
    where = "every project" if project is None else f"project {project}"
    sys.stderr.write(f"ampscope: token {created.token.id} ({args.scope}, {where}) created; "
                     "its secret is shown once, below\n")
    sys.stdout.write(created.secret + "\n")
    return 0


def _token_list(_args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.store import access_repository

    rows = [("ID", "NAME", "PROJECT", "SCOPE", "CREATED", "LAST USED", "REVOKED")]
    rows += [(t.id, t.name or "-", t.project or "*", t.scope, when(t.created_at),
              when(t.last_used_at), when(t.revoked_at))
             for t in access_repository.list_tokens(session)]
    table(rows)
    return 0


def _token_revoke(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.access import tokens

    token = tokens.revoke_token(session, args.id)
    sys.stderr.write(f"ampscope: token {token.id} revoked\n")
    return 0


def _runs_delete(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.runs import lifecycle
    from ampscope_server.runs import reads as runs

    deleted = lifecycle.delete_run(session, runs.resolve_run(session, args.id))
    sys.stderr.write(f"ampscope: run {deleted.id} (project {deleted.project}, "
                     f"{deleted.steps} steps) deleted\n")
    return 0


def _runs_prune(args: argparse.Namespace, session: Session) -> int:
    from ampscope_server.runs import lifecycle
    from ampscope_server.store import access_repository

    try:
        age = lifecycle.parse_age(args.older_than)
    except ValueError as exc:
        sys.stderr.write(f"ampscope runs prune: {exc}\n")
        return EXIT_USAGE
    if args.dry_run:
        old = access_repository.runs_older_than(session, args.project, time.time() - age)
        for run in old:
            sys.stdout.write(f"{run.id}  {run.name}  last ingest {when(run.updated_at)}\n")
        sys.stderr.write(f"ampscope: {len(old)} runs would be deleted (dry run)\n")
        return 0
    deleted = lifecycle.prune(session, args.project, age)
    for item in deleted:
        sys.stdout.write(f"{item.id}  {item.steps} steps\n")
    sys.stderr.write(f"ampscope: {len(deleted)} runs of project {args.project} deleted\n")
    return 0
