"""The live view: a run watched in a browser, served offline by the orchestrator itself.

`privnet run --view` serves one page from the orchestrator's own event loop (aiohttp; the
page's stream is Server-Sent Events), on 127.0.0.1 behind a random token in the URL;
`privnet view RUN_DIR` serves a finished run's files through the same page.

- `state`: what the page shows, a bounded and pure state object (`ViewState`): the shells
  push facts into it, the HTTP side reads snapshots and deltas of it as JSON.
- `live`: the run's side (`LiveView`): a `Lookout` the net engine pumps instead of its
  `Watch` (it counts what the orchestrator receives and passes everything on), and a
  sampler that reads the conductor, the agents' processes and the accountant twice a second.
- `files`: a finished run's directory as a `ViewState` (summary.json, metrics.csv,
  membership.json, audit.json, view.json).
- `server`: the aiohttp application: token, read-only GET routes, the event stream.
- `static/`: the page (HTML, CSS, JS and the vendored uPlot), shipped as package data.

The page never receives a model: only scalars derived from them (MSD, testing error,
epsilon, the audit's counts), so nothing it shows can rebuild one.
"""
