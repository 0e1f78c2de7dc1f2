"""fa4trace viewer (Streamlit). `fa4trace view` runs app/main.py; the modules here hold its logic."""
