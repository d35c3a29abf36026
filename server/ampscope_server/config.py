"""Settings, read once from the environment (prefix AMPSCOPE_) or given by the CLI."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DB_URL = "sqlite:///./.ampscope/ampscope.db"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AMPSCOPE_", extra="ignore")

    db_url: str = DEFAULT_DB_URL
    host: str = "127.0.0.1"
    port: int = 8765
    crash_timeout_s: float = 300.0
    """An active run with no ingest for this long is reported as crashed."""
