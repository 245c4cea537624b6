"""Video pipelines: camera-controlled Wan (``camera``) and the mini-world video model (``world``)."""
