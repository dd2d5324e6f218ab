"""Serving a trained run: reading it back for inference (``inference``), exporting it (``export``), and predicting
for new inputs (``prediction``, ``prediction_text``)."""
