"""The Alembic history on empty SQLite and Postgres: upgrade, downgrade, upgrade, no drift."""

from __future__ import annotations

import ast

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from ampscope_server.store import db
from ampscope_server.store.models import Base
from tests.migrations.support import columns, tables

TABLES_0001 = {"runs", "attempts", "layers", "steps", "layer_stats"}
TABLES_0002 = TABLES_0001 | {
    "modules", "step_nonfinite", "misuse_events", "activation_stats", "histograms"}
TABLES_0003 = TABLES_0002 | {"rollups"}
TABLES_0004 = TABLES_0003 | {"step_rechecks", "swallowed_stats"}
TABLES_0005 = TABLES_0004 | {"projects", "api_tokens", "browser_sessions", "deleted_runs"}
TABLES_0006 = TABLES_0005 | {"layer_rollups"}
TABLES_0007 = TABLES_0006 | {"run_counters"}
TABLES_0008 = TABLES_0007 | {"alert_rules", "alert_destinations", "alert_defaults",
                             "alert_episodes", "alerts", "alert_deliveries"}
TABLES_0020 = TABLES_0008 | {"step_ranks", "step_optimizers"}
TABLES_0024 = TABLES_0020 | {"step_shadows"}
TABLES_0025 = TABLES_0024 | {"step_formats"}
V2_STEP_COLUMNS = {"captured", "nonfinite_count", "misuse_count"}
V2_ATTEMPT_COLUMNS = {f"client_{name}" for name in (
    "produced", "acknowledged", "spooled", "dropped", "replayed")}



@pytest.mark.slow
def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    db.upgrade(db_url)
    assert tables(db_url) == TABLES_0025 | {"alembic_version"}
    db.downgrade(db_url, "0024")
    assert tables(db_url) == TABLES_0024 | {"alembic_version"}
    db.downgrade(db_url, "0023")
    assert tables(db_url) == TABLES_0020 | {"alembic_version"}
    assert "world_size" in columns(db_url, "runs")
    db.downgrade(db_url, "0019")
    assert tables(db_url) == TABLES_0008 | {"alembic_version"}
    assert "world_size" not in columns(db_url, "runs")
    assert "raw_name" in columns(db_url, "layers")
    db.downgrade(db_url, "0017")
    assert "raw_name" not in columns(db_url, "layers")
    assert columns(db_url, "steps") >= V2_STEP_COLUMNS
    assert columns(db_url, "rollups") == {"run_key", "level", "bucket", "series", "step_count",
                                           "skip_count"}
    db.downgrade(db_url, "0012")
    assert columns(db_url, "rollups") == {"run_key", "level", "bucket", "series"}
    assert columns(db_url, "layer_rollups") == {"run_key", "level", "bucket", "data"}
    db.downgrade(db_url, "0011")
    assert columns(db_url, "rollups") == {"run_id", "level", "bucket", "series"}
    assert columns(db_url, "layer_rollups") == {"run_id", "level", "bucket", "data"}
    assert {"run_key", "attempt"} <= columns(db_url, "steps")
    assert columns(db_url, "histograms") == {
        "step_id", "run_key", "min_exp", "max_exp", "layers", "data"}
    db.downgrade(db_url, "0010")
    assert "layer_index" in columns(db_url, "histograms")
    assert "module_index" in columns(db_url, "activation_stats")
    db.downgrade(db_url, "0009")
    assert {"run_id", "attempt_id"} <= columns(db_url, "steps")
    assert "key" not in columns(db_url, "runs")
    assert "run_id" in columns(db_url, "layer_stats")
    db.downgrade(db_url, "0007")
    assert tables(db_url) == TABLES_0007 | {"alembic_version"}
    db.downgrade(db_url, "0006")
    assert tables(db_url) == TABLES_0006 | {"alembic_version"}
    db.downgrade(db_url, "0005")
    assert tables(db_url) == TABLES_0005 | {"alembic_version"}
    assert "layer_index" in columns(db_url, "layer_stats")
    assert "amax_scaled" in columns(db_url, "rollups")
    db.downgrade(db_url, "0004")
    assert tables(db_url) == TABLES_0004 | {"alembic_version"}
    db.downgrade(db_url, "0003")
    assert tables(db_url) == TABLES_0003 | {"alembic_version"}
    db.downgrade(db_url, "0002")
    assert tables(db_url) == TABLES_0002 | {"alembic_version"}
    db.downgrade(db_url, "0001")
    assert tables(db_url) == TABLES_0001 | {"alembic_version"}
    assert not V2_STEP_COLUMNS & columns(db_url, "steps")
    assert not V2_ATTEMPT_COLUMNS & columns(db_url, "attempts")
    db.downgrade(db_url, "base")
    assert tables(db_url) == {"alembic_version"}
    db.upgrade(db_url)
    assert tables(db_url) == TABLES_0025 | {"alembic_version"}
    assert columns(db_url, "attempts") >= V2_ATTEMPT_COLUMNS


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
    db.upgrade(db_url, "0005")
    assert _scalar(db_url, "SELECT count(*) FROM projects") == 2
    assert _scalar(db_url, "SELECT created_at FROM projects WHERE name = 'vision'") == 3
    db.downgrade(db_url, "0004")
    assert _scalar(db_url, "SELECT count(*) FROM runs") == 3


def _rows(url: str, statement: str) -> list[tuple[object, ...]]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(statement))]
    finally:
        engine.dispose()


_STEP = ("INSERT INTO steps (run_id, attempt_id, seq, step, wall_time, loss, loss_class, "
         "scale_before, scale_before_class, scale_after, scale_after_class, found_inf, skipped, "
         "grad_norm_class, lr_class, duration_class) VALUES ")


@pytest.mark.slow
def test_0007_backfills_run_counters_from_stored_steps(db_url: str) -> None:
    """Counters of every run with steps, the last step by ingest order (its scale and loss,
    non-finite ones kept by their class), none for a run without steps; summaries left stale."""
    db.upgrade(db_url, "0005")
    _execute(
        db_url,
        "INSERT INTO runs VALUES ('r1', 'p', 'n', '[]', '{}', 'h', 0, 'fp16', 'active', 1, 1)",
        "INSERT INTO runs VALUES ('r2', 'p', 'n', '[]', '{}', 'h', 0, 'fp16', 'active', 2, 2)",
        "INSERT INTO runs VALUES ('r3', 'p', 'n', '[]', '{}', 'h', 0, 'fp16', 'active', 3, 3)",
        "INSERT INTO attempts (id, run_id, ordinal, pid, started_at) VALUES ('a1', 'r1', 1, 7, 1)",
        "INSERT INTO attempts (id, run_id, ordinal, pid, started_at) VALUES ('a2', 'r2', 1, 7, 1)",
        # r1: steps 5, 9 (skipped, found_inf), then a resumed step 7 ingested last, loss NaN.
        _STEP + "('r1', 'a1', 0, 5, 1.0, 2.5, 0, 4.0, 0, 4.0, 0, false, false, 0, 0, 0)",
        _STEP + "('r1', 'a1', 1, 9, 1.0, 2.0, 0, 4.0, 0, 2.0, 0, true, true, 0, 0, 0)",
        _STEP + "('r1', 'a1', 2, 7, 1.0, NULL, 1, 2.0, 0, NULL, 2, false, false, 0, 0, 0)",
        _STEP + "('r2', 'a2', 0, 0, 1.0, 1.5, 0, 8.0, 0, 8.0, 0, true, false, 0, 0, 0)",
    )
    db.upgrade(db_url)
    rows = _rows(db_url, "SELECT run_id, version, num_steps, skipped_steps, nonfinite_steps, "
                         "last_step, last_scale, last_scale_class, last_loss, last_loss_class, "
                         "summary_version, summary_step FROM run_counters ORDER BY run_id")
    assert rows == [
        ("r1", 1, 3, 1, 1, 9, None, 2, None, 1, None, None),
        ("r2", 1, 1, 0, 1, 0, 8.0, 0, 1.5, 0, None, None),
    ]
    last_ids = _rows(db_url, 'SELECT c.last_id = max(s.id) FROM run_counters c JOIN runs r '
                             'ON r.id = c.run_id JOIN steps s ON s.run_key = r."key" '
                             "GROUP BY c.run_id, c.last_id")
    assert last_ids == [(True,), (True,)] or last_ids == [(1,), (1,)]
    db.downgrade(db_url, "0005")
    assert "run_counters" not in tables(db_url)
    assert _scalar(db_url, "SELECT count(*) FROM steps") == 4


def test_models_match_the_migrated_schema(db_url: str) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
            assert context.get_current_revision() == db.head_revision() == "0026"
    finally:
        engine.dispose()


def test_constraints_follow_the_naming_convention(postgres_url: str) -> None:
    db.upgrade(postgres_url)
    engine = db.make_engine(postgres_url)
    try:
        inspector = inspect(engine)
        assert inspector.get_pk_constraint("steps")["name"] == "pk_steps"
        assert {fk["name"] for fk in inspector.get_foreign_keys("steps")} == {
            "fk_steps_run_key_runs"}
        assert [u["name"] for u in inspector.get_unique_constraints("steps")] == [
            "uq_steps_run_key_attempt_seq"]
        indexes = inspector.get_indexes("steps")
        assert {i["name"] for i in indexes if not i.get("duplicates_constraint")} == {
            "ix_steps_run_key_step", "ix_steps_run_key_id", "ix_steps_run_key_event_step",
            "ix_steps_run_key_misuse_step", "ix_steps_run_key_notable_step"}
        for table in ("step_nonfinite", "misuse_events", "step_rechecks"):
            assert inspector.get_pk_constraint(table)["name"] == f"pk_{table}"
            assert [fk["name"] for fk in inspector.get_foreign_keys(table)] == [
                f"fk_{table}_step_id_steps"]
        for table in ("activation_stats", "histograms", "swallowed_stats"):
            assert inspector.get_pk_constraint(table)["name"] == f"pk_{table}"
            assert {fk["name"] for fk in inspector.get_foreign_keys(table)} == {
                f"fk_{table}_step_id_steps", f"fk_{table}_run_key_runs"}
            assert [i["name"] for i in inspector.get_indexes(table)] == [
                f"ix_{table}_run_key_step_id"]
        for table in ("step_ranks", "step_optimizers"):  # revision 0020
            assert inspector.get_pk_constraint(table)["name"] == f"pk_{table}"
            assert {fk["name"] for fk in inspector.get_foreign_keys(table)} == {
                f"fk_{table}_step_id_steps", f"fk_{table}_run_key_runs"}
        assert sorted(str(i["name"]) for i in inspector.get_indexes("step_ranks")) == [
            "ix_step_ranks_run_key_nonfinite_step", "ix_step_ranks_run_key_step_id"]
        assert [i["name"] for i in inspector.get_indexes("step_optimizers")] == [
            "ix_step_optimizers_run_key_step_id"]
        for table in ("rollups", "layer_rollups"):
            assert inspector.get_pk_constraint(table)["name"] == f"pk_{table}"
            assert [fk["name"] for fk in inspector.get_foreign_keys(table)] == [
                f"fk_{table}_run_key_runs"]
            assert inspector.get_pk_constraint(table)["constrained_columns"] == [
                "run_key", "level", "bucket"]
        assert inspector.get_pk_constraint("layer_stats")["name"] == "pk_layer_stats"
        assert {fk["name"] for fk in inspector.get_foreign_keys("layer_stats")} == {
            "fk_layer_stats_step_id_steps", "fk_layer_stats_run_key_runs"}
        assert [i["name"] for i in inspector.get_indexes("layer_stats")] == [
            "ix_layer_stats_run_key_step_id"]
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
    assert (versions / "0010_integer_run_keys.py").is_file()
    assert (versions / "0011_packed_sampled_stats.py").is_file()


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
