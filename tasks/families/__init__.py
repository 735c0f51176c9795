"""Model families as plug-ins (`base.ModelFamily`): one module per family, chosen by `artifact.kind` in `registry`."""
