"""The decision families' validation (SemIf and the chat path): JevBench-format tasks (`jevbench`), the project's own
decision set (`decision_set`), the chat path's readout (`chat_readout`) and the decision gate (`evaluate`). The shared
runner, metrics, gates and report stay in `validation/`."""
