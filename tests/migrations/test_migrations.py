"""The Alembic history on empty SQLite and Postgres: upgrade, downgrade, upgrade, no drift."""

from __future__ import annotations

import ast

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from ampscope_server import db
from ampscope_server.models import Base

TABLES_0001 = {"runs", "attempts", "layers", "steps", "layer_stats"}
TABLES_0002 = TABLES_0001 | {
    "modules", "step_nonfinite", "misuse_events", "activation_stats", "histograms"}
TABLES_0003 = TABLES_0002 | {"rollups"}
TABLES_0004 = TABLES_0003 | {"step_rechecks", "swallowed_stats"}
TABLES_0005 = TABLES_0004 | {"projects", "api_tokens", "browser_sessions", "deleted_runs"}
TABLES_0006 = TABLES_0005 | {"layer_rollups"}
V2_STEP_COLUMNS = {"captured", "nonfinite_count", "misuse_count"}
V2_ATTEMPT_COLUMNS = {f"client_{name}" for name in (
    "produced", "acknowledged", "spooled", "dropped", "replayed")}


def _tables(url: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _columns(url: str, table: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        return {column["name"] for column in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    db.upgrade(db_url)
    assert _tables(db_url) == TABLES_0006 | {"alembic_version"}
    assert _columns(db_url, "steps") >= V2_STEP_COLUMNS
    assert _columns(db_url, "rollups") == {"run_id", "level", "bucket", "series"}
    db.downgrade(db_url, "0005")
    assert _tables(db_url) == TABLES_0005 | {"alembic_version"}
    assert "layer_index" in _columns(db_url, "layer_stats")
    assert "amax_scaled" in _columns(db_url, "rollups")
    db.downgrade(db_url, "0004")
    assert _tables(db_url) == TABLES_0004 | {"alembic_version"}
    db.downgrade(db_url, "0003")
    assert _tables(db_url) == TABLES_0003 | {"alembic_version"}
    db.downgrade(db_url, "0002")
    assert _tables(db_url) == TABLES_0002 | {"alembic_version"}
    db.downgrade(db_url, "0001")
    assert _tables(db_url) == TABLES_0001 | {"alembic_version"}
    assert not V2_STEP_COLUMNS & _columns(db_url, "steps")
    assert not V2_ATTEMPT_COLUMNS & _columns(db_url, "attempts")
    db.downgrade(db_url, "base")
    assert _tables(db_url) == {"alembic_version"}
    db.upgrade(db_url)
    assert _tables(db_url) == TABLES_0006 | {"alembic_version"}
    assert _columns(db_url, "attempts") >= V2_ATTEMPT_COLUMNS


def _execute(url: str, *statements: str) -> None:
    engine = db.make_engine(url)
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.execute(text(statement))
    finally:
        engine.dispose()


def _scalar(url: str, statement: str) -> object:
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(text(statement)).scalar()
    finally:
        engine.dispose()


def test_0002_keeps_v1_data_both_ways(db_url: str) -> None:
    """Upgrading under stored v1 rows and downgrading again loses none of them.

    Guards against a table copy of `steps` in batch mode: with foreign keys on, dropping the old
    `steps` would cascade to `layer_stats` (and on SQLite lose AUTOINCREMENT).
    """
    db.upgrade(db_url, "0001")
    _execute(
        db_url,
        "INSERT INTO runs VALUES ('r', 'p', 'n', '[]', '{}', 'h', 0, 'fp16', 'active', 1, 1)",
        "INSERT INTO attempts VALUES ('a', 'r', 1, 7, 1.0)",
        "INSERT INTO steps (run_id, attempt_id, seq, step, wall_time, loss_class, "
        "scale_before_class, scale_after_class, found_inf, skipped, grad_norm_class, lr_class, "
        "duration_class) VALUES ('r', 'a', 0, 0, 1.0, 0, 0, 0, false, false, 0, 0, 0)",
        "INSERT INTO layer_stats VALUES ((SELECT id FROM steps), 0, 1, 1, 0, 0, 0, 0, 0, 1)",
    )
    db.upgrade(db_url, "0002")
    assert _scalar(db_url, "SELECT count(*) FROM layer_stats") == 1
    assert _scalar(db_url, "SELECT captured FROM steps") is None
    assert _scalar(db_url, "SELECT client_produced FROM attempts") is None
    _execute(
        db_url,
        "UPDATE steps SET captured = 'before_unscale', nonfinite_count = 1",
        "INSERT INTO step_nonfinite VALUES ((SELECT id FROM steps), 0, 0, 'nan')",
        "INSERT INTO histograms VALUES ((SELECT id FROM steps), 0, -2, 2, '[1, 0, 0, 0, 0, 0,"
        " 0, 0, 0]')",
    )
    db.downgrade(db_url, "0001")
    assert _scalar(db_url, "SELECT count(*) FROM steps") == 1
    assert _scalar(db_url, "SELECT count(*) FROM layer_stats") == 1
    if db.is_sqlite(db_url):
        schema = _scalar(db_url, "SELECT sql FROM sqlite_master WHERE name = 'steps'")
        assert "AUTOINCREMENT" in str(schema)


def test_0005_backfills_projects_from_stored_runs(db_url: str) -> None:
    db.upgrade(db_url, "0004")
    _execute(
        db_url,
        "INSERT INTO runs VALUES ('r1', 'vision', 'n', '[]', '{}', 'h', 0, 'fp16', 'active', 5, 5)",
        "INSERT INTO runs VALUES ('r2', 'vision', 'n', '[]', '{}', 'h', 0, 'fp16', 'active', 3, 3)",
        "INSERT INTO runs VALUES ('r3', 'nlp', 'n', '[]', '{}', 'h', 0, 'fp16', 'active', 9, 9)",
    )
    db.upgrade(db_url)
    assert _scalar(db_url, "SELECT count(*) FROM projects") == 2
    assert _scalar(db_url, "SELECT created_at FROM projects WHERE name = 'vision'") == 3
    db.downgrade(db_url, "0004")
    assert _scalar(db_url, "SELECT count(*) FROM runs") == 3


def test_models_match_the_migrated_schema(db_url: str) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
            assert context.get_current_revision() == db.head_revision() == "0006"
    finally:
        engine.dispose()


def test_constraints_follow_the_naming_convention(postgres_url: str) -> None:
    db.upgrade(postgres_url)
    engine = db.make_engine(postgres_url)
    try:
        inspector = inspect(engine)
        assert inspector.get_pk_constraint("steps")["name"] == "pk_steps"
        assert {fk["name"] for fk in inspector.get_foreign_keys("steps")} == {
            "fk_steps_run_id_runs", "fk_steps_attempt_id_attempts"}
        assert [u["name"] for u in inspector.get_unique_constraints("steps")] == [
            "uq_steps_run_id_attempt_id_seq"]
        indexes = inspector.get_indexes("steps")
        assert {i["name"] for i in indexes if not i.get("duplicates_constraint")} == {
            "ix_steps_run_id_step", "ix_steps_run_id_id"}
        for table in ("step_nonfinite", "misuse_events", "activation_stats", "histograms",
                      "step_rechecks", "swallowed_stats"):
            assert inspector.get_pk_constraint(table)["name"] == f"pk_{table}"
            assert [fk["name"] for fk in inspector.get_foreign_keys(table)] == [
                f"fk_{table}_step_id_steps"]
        for table in ("rollups", "layer_rollups"):
            assert inspector.get_pk_constraint(table)["name"] == f"pk_{table}"
            assert [fk["name"] for fk in inspector.get_foreign_keys(table)] == [
                f"fk_{table}_run_id_runs"]
        assert inspector.get_pk_constraint("layer_stats")["name"] == "pk_layer_stats"
        assert {fk["name"] for fk in inspector.get_foreign_keys("layer_stats")} == {
            "fk_layer_stats_step_id_steps", "fk_layer_stats_run_id_runs"}
        assert [i["name"] for i in inspector.get_indexes("layer_stats")] == [
            "ix_layer_stats_run_id_step_id"]
        assert inspector.get_pk_constraint("modules")["name"] == "pk_modules"
        assert [fk["name"] for fk in inspector.get_foreign_keys("modules")] == [
            "fk_modules_run_id_runs"]
    finally:
        engine.dispose()


def test_the_script_location_is_the_installed_package() -> None:
    from importlib.resources import files

    location = db.alembic_config("sqlite://").get_main_option("script_location")
    assert location == str(files("ampscope_server._migrations"))
    versions = files("ampscope_server._migrations") / "versions"
    assert (versions / "0001_initial.py").is_file()
    assert (versions / "0002_wire_v2.py").is_file()
    assert (versions / "0003_rollups.py").is_file()
    assert (versions / "0004_wire_v3.py").is_file()
    assert (versions / "0005_team.py").is_file()
    assert (versions / "0006_packed_layer_stats.py").is_file()


def test_no_migration_imports_application_code() -> None:
    """A revision is history: importing live code (`ampscope_server`) would let a later edit of
    that code silently change what an old revision does to a database."""
    from importlib.resources import files

    versions = files("ampscope_server._migrations") / "versions"
    found: dict[str, list[str]] = {}
    scripts = sorted((entry for entry in versions.iterdir() if entry.name.endswith(".py")),
                     key=lambda entry: entry.name)
    for script in scripts:
        for node in ast.walk(ast.parse(script.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.split(".")[0] in ("ampscope_server", "ampscope"):
                    found.setdefault(script.name, []).append(name)
    assert len(scripts) >= 7  # __init__.py and 0001 ... 0006
    assert found == {}
