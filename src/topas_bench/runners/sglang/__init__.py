"""The real SGLang engine (docs/design.md section 7): the plugin that installs our policies in
SGLang's scheduler (`plugin`, `adapter`), the server launcher, the asyncio workflow client,
`calibrate`.

Nothing here imports SGLang at import time; only `adapter` does, inside SGLang's processes.
"""
