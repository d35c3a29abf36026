"""Engine setup per dialect (db.make_engine), on real databases."""

from __future__ import annotations

from sqlalchemy import text

from ampscope_server.store import db


class TestPostgresEngine:
    def test_connections_run_without_jit(self, postgres_url: str) -> None:
        """Chart queries over a long run have high estimated costs and would be JIT-compiled
        (hundreds of ms) for nothing: the server turns JIT off on its connections."""
        engine = db.make_engine(postgres_url)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SHOW jit")).scalar() == "off"
        finally:
            engine.dispose()

    def test_options_in_the_url_are_kept(self, postgres_url: str) -> None:
        engine = db.make_engine(f"{postgres_url}?options=-c%20work_mem%3D7MB")
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SHOW work_mem")).scalar() == "7MB"
                assert conn.execute(text("SHOW jit")).scalar() == "off"
        finally:
            engine.dispose()
