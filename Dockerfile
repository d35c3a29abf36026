# The ampscope server (no torch): `docker compose up` builds this beside Postgres.
FROM python:3.11-slim

WORKDIR /app
COPY pyproject.toml README.md ./
COPY client_hook ./client_hook
COPY server ./server
COPY web ./web
COPY migrations ./migrations
RUN pip install --no-cache-dir ".[server]"

EXPOSE 8765
CMD ["ampscope", "serve", "--host", "0.0.0.0", "--port", "8765"]
