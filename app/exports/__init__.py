"""The export jobs behind app/export.py (the command line and the app's download buttons):

    common.py      ExportError, atomic writes, one kaleido Chromium per batch of images
    images.py      figures as PNG / SVG / PDF / HTML; animated figures as one still frame
    animations.py  animated figures as GIF / MP4
    data.py        schedules as Chrome-trace JSON, trace tables as CSV / parquet

Import the public names from app.export (they are re-exported there).
"""
