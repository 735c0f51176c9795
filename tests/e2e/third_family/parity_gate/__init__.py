"""The toy family's validation package: its dataset of numbers and the gate that scores them (`parity`)."""
