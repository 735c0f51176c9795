"""Building and proving model artifacts: GGUF, ONNX export, the tiny test models, NLI training, model.tar.gz."""
