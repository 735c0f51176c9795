"""The ONNX NLI family's validation: NLI pair files (`pairs`), their checks (`expectations`), the project's own set
(`builtin_set`), the batch runner (`runner`) and the gate (`evaluate`). The shared metrics, gates and report stay in
`validation/`."""
