"""The local backend: a content-addressed store on disk, process images, endpoints as routers and model-server
processes on 127.0.0.1.

`artifact_store` is the artifact store, `process_image` the image builder, `hosting.LoopbackHosting` the `Hosting`
seam, built on `supervisor.ProcessSupervisor`, which starts, persists, finds and stops the processes, and on
`rollout`, which rolls a component's copies batch by batch through it; `router` is the endpoint process itself (stdlib
only, so it starts fast).
"""
