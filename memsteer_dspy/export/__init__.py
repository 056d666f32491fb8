"""Supervision and designs handed to other memory optimizers.

The MemSteer paper feeds the same verified QA–evidence supervision to M* and MemEvolve. This
package writes what each of them consumes:

* :func:`~memsteer_dspy.export.mstar.export_mstar` — data files and a dataset-loader module for
  M* (wbopan/mstar): one train ``DataItem`` per record (timestamped text, ingested as knowledge),
  one val ``DataItem`` per QA item (``metadata`` keeps ``qa_category`` and ``evidence_ids``).
* :func:`~memsteer_dspy.export.memevolve.export_memevolve` — a MemEvolve (EvolveLab) memory
  provider that serves a tuned :class:`~memsteer_dspy.memory.MemoryDesign` over the history, plus
  the supervision as a task file.

Both are plain files; neither project needs to be installed to write them (``memsteer export``).
"""

from __future__ import annotations

from memsteer_dspy.export.common import ExportItem, qa_export_items, record_raw_text
from memsteer_dspy.export.memevolve import export_memevolve
from memsteer_dspy.export.mstar import export_mstar

__all__ = ["ExportItem", "export_memevolve", "export_mstar", "qa_export_items", "record_raw_text"]
