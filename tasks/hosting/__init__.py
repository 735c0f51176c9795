"""Local hosting backend: endpoint routers and model-server copies as processes on 127.0.0.1.

`tasks.hosting.router` is the endpoint process (stdlib only, so it starts fast);
`tasks.hosting.local.LocalHosting` starts, persists, finds and stops endpoints and components.
"""
