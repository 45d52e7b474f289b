"""Reports as people and tools read them: the terminal and HTML sections (``render*``), the JSON export
and the TensorBoard, Weights & Biases and MLflow sinks."""
