"""Evaluation against the mini-world's ground truth: edit metrics and the three editing tasks' scores, layout and
repetition of generated images, image quality (PSNR, SSIM), and how well generated clips follow their camera.

Modules: ``metrics`` (ground-truth metrics of edits), ``edit_scores`` (one row per method of each editing task),
``layout_metrics``, ``image_quality``, ``camera_following`` (RotErr / TransErr measured with OpenCV),
``video_eval`` (camera following of the world video model).
"""
