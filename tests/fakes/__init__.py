"""Stand-ins for real model servers, so hosting tests run without llama.cpp or ONNX Runtime."""
