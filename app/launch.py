"""`python app/launch.py run app/main.py [streamlit options] -- [BUNDLES...]`: Streamlit's own
command line, with the viewer's heavy imports done before the server starts listening.

Streamlit runs app/main.py only when a browser connects, so without this the first page view
also pays for importing pandas (~0.35 s here, pulled in lazily by Arrow and st.table), plotly
and the fa4trace analysis modules (~0.2 s). `fa4trace view` and the headless tests/benchmark
start the server through this file; the modules are the same objects the script then uses.
"""

from __future__ import annotations

import sys
from pathlib import Path


def preload() -> None:
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    import pandas  # noqa: F401
    import plotly.graph_objects  # noqa: F401
    import plotly.subplots  # noqa: F401

    import app.grid  # noqa: F401
    import app.iterations  # noqa: F401
    import app.page  # noqa: F401  (data, metrics, timeline, perfetto_ui, fa4trace.analysis/perfetto)


def main() -> None:
    preload()
    from streamlit.web.cli import main as streamlit_main

    sys.argv = ["streamlit", *sys.argv[1:]]
    sys.exit(streamlit_main())


if __name__ == "__main__":
    main()
