"""Alembic environment for ampscope, shipped as `ampscope_server._migrations`."""
