"""The live view: a run watched in a browser, served offline by the orchestrator itself.

`privnet run --view` serves one page from the orchestrator's own event loop (aiohttp,
Server-Sent Events) on 127.0.0.1 behind a random token; `privnet view RUN_DIR` serves a
finished run's files through the same page. `state` is what the page shows (`ViewState`,
bounded and pure), `live` the run's side that feeds it, `files` a finished run's directory
read into one, `server` the application, `static/` the page. The page never receives a
model, only scalars derived from them, so nothing it shows can rebuild one.
"""
