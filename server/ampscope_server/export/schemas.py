"""The JSON export's document: everything stored of a run, written step by step
(`export.streams`)."""

from __future__ import annotations

from pydantic import BaseModel

from ampscope_server.ingest.wire import LayerInfo, ModuleInfo
from ampscope_server.runs.schemas import RunDetail, StepExport


class ExportRead(BaseModel):
    run: RunDetail
    layers: list[LayerInfo]
    modules: list[ModuleInfo]
    steps: list[StepExport]
