"""A Spaces-style entry point: the ``mmpos app`` page on the embedded mini-world models (CPU), served on
0.0.0.0:7860 (``python app.py``; the hosting service runs this file)."""

from mmpos.pipelines.commands.app import launch

if __name__ == "__main__":
    launch("world", host="0.0.0.0", port=7860)
