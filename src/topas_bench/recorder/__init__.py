"""Recording real MetaGPT runs: `hook` (runs inside the MetaGPT venv), `record` (starts it),
`responder` (a scripted OpenAI-compatible server for offline runs), `cli` (``trace`` commands)."""
