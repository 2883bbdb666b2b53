"""A synthetic panel of many short series whose sector decides how they respond to their own
input, for trying `--static-data`.

48 ids in 4 sectors, 800 hours each. Each id has an input `x` (an AR(1) process of its own) and
a value `y` that follows `x` an hour later with a gain of its sector's sign and size (+1, -1,
+0.5, -0.5), plus a daily cycle, an AR(1) disturbance and noise. An id's own history is short,
so a model that tells ids apart only by their one-hot code must learn each id's gain from its
own 800 rows; the static table says which ids share a gain. Writes the long file to stdout and
the static table (`id,sector,size`; `size` is noise, an attribute that explains nothing) to the
path given as the first argument.

    python3 tools/synthetic/static_panel.py statics.csv > panel.csv
    mamba2 train --data panel.csv --id-column id --columns y,x --static-data statics.csv
"""
import datetime
import math
import random
import sys

random.seed(5)
t0 = datetime.datetime(2022, 1, 1)
gains = {"alpha": 1.0, "beta": -1.0, "gamma": 0.5, "delta": -0.5}
sectors = list(gains)
long_rows = ["id,date,y,x"]
static_rows = ["id,sector,size"]
for i in range(48):
    sector = sectors[i % 4]
    sid = f"s{i:02d}"
    static_rows.append(f"{sid},{sector},{random.uniform(1, 100):.1f}")
    x, d, x_prev = 0.0, 0.0, 0.0
    phase = random.uniform(0, 24)
    for t in range(800):
        x_prev, x = x, 0.7 * x + random.gauss(0, 1)
        d = 0.9 * d + random.gauss(0, 0.2)
        y = gains[sector] * x_prev + 0.5 * math.sin(2 * math.pi * (t + phase) / 24) + d + random.gauss(0, 0.1)
        stamp = (t0 + datetime.timedelta(hours=t)).strftime("%Y-%m-%d %H:%M:%S")
        long_rows.append(f"{sid},{stamp},{y:.4f},{x:.4f}")
with open(sys.argv[1], "w") as f:
    f.write("\n".join(static_rows) + "\n")
sys.stdout.write("\n".join(long_rows) + "\n")
