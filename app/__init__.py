"""fa4trace viewer (Streamlit), installed as ``fa4trace.viewer`` (source folder ``app/``).

`fa4trace view` serves server.py (st.App: main.py plus the Perfetto UI routes); the modules
here hold the page's logic. Nothing here imports cutlass or CuTe.
"""
