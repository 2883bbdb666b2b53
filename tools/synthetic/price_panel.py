"""A synthetic hourly price panel in long format, for trying `--future-columns` at the defaults.

Three zones, 5,000 hours each: a load with daily and weekly cycles and a slow weather-driven
deviation, a renewable generation with a daytime bump and its own slow deviation, and a price
that is a convex function of load minus generation plus noise. The `load` and `gen` columns are
day-ahead forecasts of them (the actual values plus forecast noise), known before the hour.

    python3 tools/synthetic/price_panel.py > prices.csv
    mamba2 train --data prices.csv --id-column id --future-columns load,gen --out runs/fut
    mamba2 train --data prices.csv --id-column id --columns price --out runs/past
"""
import datetime
import math
import random
import sys

random.seed(3)
t0 = datetime.datetime(2021, 1, 1)
out = ["id,date,price,load,gen"]
for k, zone in enumerate(["DE", "FR", "NL"]):
    weather, wind = 0.0, 0.0
    for t in range(5000):
        hour, day = t % 24, (t // 24) % 7
        weather = 0.95 * weather + random.gauss(0, 0.3)
        load = 50 + 10 * math.sin(2 * math.pi * (hour - 7) / 24) + (-6 if day >= 5 else 0) + 5 * weather + 3 * k
        wind = 0.9 * wind + random.gauss(0, 0.5)
        gen = 20 + 8 * max(0.0, math.sin(2 * math.pi * (hour - 6) / 24)) + 6 * wind
        resid = load - gen
        price = 30 + 0.04 * resid**2 / (1 + 0.02 * abs(resid)) + 0.8 * resid + random.gauss(0, 3) + 5 * k
        load_forecast, gen_forecast = load + random.gauss(0, 1.5), gen + random.gauss(0, 2.0)
        stamp = (t0 + datetime.timedelta(hours=t)).strftime("%Y-%m-%d %H:%M:%S")
        out.append(f"{zone},{stamp},{price:.3f},{load_forecast:.3f},{gen_forecast:.3f}")
sys.stdout.write("\n".join(out) + "\n")
