"""The Alembic history on empty SQLite and Postgres: upgrade, downgrade, upgrade, no drift."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from ampscope_server import db
from ampscope_server.models import Base

TABLES = {"runs", "attempts", "layers", "steps", "layer_stats"}


def _tables(url: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    db.upgrade(db_url)
    assert _tables(db_url) == TABLES | {"alembic_version"}
    db.downgrade(db_url, "base")
    assert _tables(db_url) == {"alembic_version"}
    db.upgrade(db_url)
    assert _tables(db_url) == TABLES | {"alembic_version"}


def test_models_match_the_migrated_schema(db_url: str) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
            assert context.get_current_revision() == db.head_revision() == "0001"
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
    finally:
        engine.dispose()


def test_the_script_location_is_the_installed_package() -> None:
    from importlib.resources import files

    location = db.alembic_config("sqlite://").get_main_option("script_location")
    assert location == str(files("ampscope_server._migrations"))
    assert (files("ampscope_server._migrations") / "versions" / "0001_initial.py").is_file()
