#!/usr/bin/env python3
"""Write replicas of the ERA5 Zarr stores weather-ML teams train from.

    make_replica.py OUT [--kind arco|wb2|both] [--size small|full]
                        [--times N] [--pressure-vars N] [--surface-vars N]

--kind arco: an ARCO-ERA5-like store (gs://gcp-public-data-arco-era5,
"full_37-1h-0p25deg-chunk-1.zarr-v3"): Zarr v2, consolidated (.zmetadata),
hourly, 37 pressure levels; every pressure-level variable chunked
(time 1, level 37, latitude, longitude), the single-level ones
(time 1, latitude, longitude); Blosc LZ4 with byte shuffle, the writer's
default of zarr 2; ARCO's variable names, dimension names
(_ARRAY_DIMENSIONS) and attributes; latitude from 90 down to -90.

--kind wb2: a WeatherBench2-like store (gs://weatherbench2/datasets/era5/
1959-2023_01_10-wb13-6h-1440x721...zarr): the same, 6-hourly, on the 13
levels of WeatherBench2 and GraphCast, latitude from -90 up to 90, and the
static fields (land_sea_mask, geopotential_at_surface) without a time
dimension.

--size small is for tests (33 x 64 grid); full is the real 0.25 degree
grid (721 x 1440: a pressure-level chunk of ARCO holds 154 MB of float32)
for benchmarks. Values are smooth fields with noise, seeded, so that two
runs write the same bytes and Blosc compresses them about as it does ERA5.
Written by zarr-python with numcodecs' Blosc: an independent writer.

Each store is OUT/<kind>.zarr; OUT/<kind>.json describes it (variables,
levels, shape), for tests and benchmarks.
"""
import argparse
import json
import os
import sys

import numpy as np
import numcodecs
import zarr

ARCO_LEVELS = [1, 2, 3, 5, 7, 10, 20, 30, 50, 70, 100, 125, 150, 175, 200, 225, 250, 300, 350,
               400, 450, 500, 550, 600, 650, 700, 750, 775, 800, 825, 850, 875, 900, 925, 950, 975, 1000]
WB2_LEVELS = [50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000]

# name: (short_name, long_name, units, standard_name, base, amplitude)
PRESSURE = {
    "temperature": ("t", "Temperature", "K", "air_temperature", 250.0, 30.0),
    "geopotential": ("z", "Geopotential", "m**2 s**-2", "geopotential", 60000.0, 40000.0),
    "u_component_of_wind": ("u", "U component of wind", "m s**-1", "eastward_wind", 5.0, 20.0),
    "v_component_of_wind": ("v", "V component of wind", "m s**-1", "northward_wind", 0.0, 15.0),
    "specific_humidity": ("q", "Specific humidity", "kg kg**-1", "specific_humidity", 0.004, 0.004),
    "vertical_velocity": ("w", "Vertical velocity", "Pa s**-1", "lagrangian_tendency_of_air_pressure", 0.0, 0.5),
    "relative_humidity": ("r", "Relative humidity", "%", "relative_humidity", 60.0, 35.0),
    "divergence": ("d", "Divergence", "s**-1", "divergence_of_wind", 0.0, 1e-5),
}
SURFACE = {
    "2m_temperature": ("t2m", "2 metre temperature", "K", "", 280.0, 25.0),
    "10m_u_component_of_wind": ("u10", "10 metre U wind component", "m s**-1", "", 0.0, 8.0),
    "10m_v_component_of_wind": ("v10", "10 metre V wind component", "m s**-1", "", 0.0, 8.0),
    "mean_sea_level_pressure": ("msl", "Mean sea level pressure", "Pa", "air_pressure_at_mean_sea_level", 101325.0, 1500.0),
    "surface_pressure": ("sp", "Surface pressure", "Pa", "surface_air_pressure", 98000.0, 5000.0),
    "total_precipitation": ("tp", "Total precipitation", "m", "", 0.0005, 0.0005),
    "toa_incident_solar_radiation": ("tisr", "TOA incident solar radiation", "J m**-2", "", 1.2e6, 1.2e6),
}
STATIC = {
    "land_sea_mask": ("lsm", "Land-sea mask", "(0 - 1)", "land_binary_mask", 0.5, 0.5),
    "geopotential_at_surface": ("z", "Geopotential", "m**2 s**-2", "geopotential", 3000.0, 3000.0),
}


def blosc():
    # zarr 2's default compressor, which ARCO-ERA5 and WeatherBench2 kept.
    return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)


def attrs(spec, dims):
    short, long, units, standard, _, _ = spec
    a = {"long_name": long, "short_name": short, "units": units, "_ARRAY_DIMENSIONS": dims}
    if standard:
        a["standard_name"] = standard
    return a


def field(rng, lat, lon, t, levels, base, amp):
    """A smooth field (levels, lat, lon) moving with t, with noise."""
    phi = np.deg2rad(lat)[None, :, None]
    lam = np.deg2rad(lon)[None, None, :]
    lev = np.asarray(levels, dtype=np.float64)[:, None, None] / 1000.0
    f = base * (0.6 + 0.4 * lev) + amp * (np.cos(phi) * np.sin(lam + 0.26 * t + 2 * lev)
                                          + 0.3 * np.sin(3 * phi) * np.cos(2 * lam - lev))
    f = f + rng.standard_normal(f.shape) * (0.02 * amp)
    return f.astype(np.float32)


def write(out, kind, size, times, npressure, nsurface):
    levels = ARCO_LEVELS if kind == "arco" else WB2_LEVELS
    h, w = (721, 1440) if size == "full" else (33, 64)
    lat = np.linspace(90, -90, h) if kind == "arco" else np.linspace(-90, 90, h)
    lon = np.arange(w) * (360.0 / w)
    step = 1 if kind == "arco" else 6
    path = os.path.join(out, kind + ".zarr")
    g = zarr.open_group(path, mode="w", zarr_format=2)
    g.attrs.update({
        "title": "zarrfs replica of " + ("ARCO-ERA5 (full_37-1h-0p25deg-chunk-1)" if kind == "arco"
                                         else "WeatherBench2 ERA5 (wb13-6h-1440x721)"),
        "valid_time_start": "1940-01-01" if kind == "arco" else "1959-01-01",
        "replica_of": ("gs://gcp-public-data-arco-era5/ar/full_37-1h-0p25deg-chunk-1.zarr-v3" if kind == "arco"
                       else "gs://weatherbench2/datasets/era5/1959-2023_01_10-wb13-6h-1440x721_with_derived_variables.zarr"),
    })

    def coord(name, values, dtype, a, chunks=None):
        arr = g.create_array(name, shape=(len(values),), chunks=(chunks or len(values),), dtype=dtype,
                             compressors=blosc(), fill_value=None)
        arr[:] = np.asarray(values, dtype=dtype)
        arr.attrs.update(a)

    hours0 = 350640 if kind == "arco" else 517344  # hours since 1900-01-01 of 1940-01-01 / 1959-01-01
    coord("time", [hours0 + step * i for i in range(times)], "int64",
          {"calendar": "proleptic_gregorian", "units": "hours since 1900-01-01", "_ARRAY_DIMENSIONS": ["time"]},
          chunks=max(1, min(times, 1000)))
    coord("level", levels, "int64", {"long_name": "pressure_level", "units": "millibars", "_ARRAY_DIMENSIONS": ["level"]})
    coord("latitude", lat, "float32", {"long_name": "latitude", "units": "degrees_north", "_ARRAY_DIMENSIONS": ["latitude"]})
    coord("longitude", lon, "float32", {"long_name": "longitude", "units": "degrees_east", "_ARRAY_DIMENSIONS": ["longitude"]})

    rng = np.random.default_rng(20240101 if kind == "arco" else 20240202)
    pressure = list(PRESSURE.items())[:npressure]
    surface = list(SURFACE.items())[:nsurface]
    static = list(STATIC.items())
    for name, spec in pressure:
        a = g.create_array(name, shape=(times, len(levels), h, w), chunks=(1, len(levels), h, w),
                           dtype="float32", compressors=blosc(), fill_value=np.nan)
        a.attrs.update(attrs(spec, ["time", "level", "latitude", "longitude"]))
        for t in range(times):
            a[t] = field(rng, lat, lon, t, levels, spec[4], spec[5])
    for name, spec in surface + (static if kind == "arco" else []):
        # ARCO keeps its "invariant" fields on the time axis too.
        a = g.create_array(name, shape=(times, h, w), chunks=(1, h, w), dtype="float32",
                           compressors=blosc(), fill_value=np.nan)
        a.attrs.update(attrs(spec, ["time", "latitude", "longitude"]))
        for t in range(times):
            a[t] = field(rng, lat, lon, 0 if name in STATIC else t, [1000], spec[4], spec[5])[0]
    if kind == "wb2":
        for name, spec in static:
            a = g.create_array(name, shape=(h, w), chunks=(h, w), dtype="float32",
                               compressors=blosc(), fill_value=np.nan)
            a.attrs.update(attrs(spec, ["latitude", "longitude"]))
            a[:] = field(rng, lat, lon, 0, [1000], spec[4], spec[5])[0]
    zarr.consolidate_metadata(path, zarr_format=2)
    desc = {
        "store": kind + ".zarr", "kind": kind, "size": size, "times": times, "levels": levels,
        "grid": [h, w], "pressure": [n for n, _ in pressure],
        "surface": [n for n, _ in surface] + ([n for n, _ in static] if kind == "arco" else []),
        "static": [] if kind == "arco" else [n for n, _ in static],
        "chunk_bytes": len(levels) * h * w * 4,
    }
    with open(os.path.join(out, kind + ".json"), "w") as f:
        json.dump(desc, f, indent=1)
    return desc


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--kind", choices=["arco", "wb2", "both"], default="both")
    p.add_argument("--size", choices=["small", "full"], default="small")
    p.add_argument("--times", type=int, default=None, help="time steps (default 4 small, 2 full)")
    p.add_argument("--pressure-vars", type=int, default=None, help="pressure-level variables (default all 8 small, 6 full)")
    p.add_argument("--surface-vars", type=int, default=None, help="single-level variables (default all 7)")
    a = p.parse_args()
    times = a.times or (4 if a.size == "small" else 2)
    npres = a.pressure_vars if a.pressure_vars is not None else (len(PRESSURE) if a.size == "small" else 6)
    nsurf = a.surface_vars if a.surface_vars is not None else len(SURFACE)
    os.makedirs(a.out, exist_ok=True)
    for kind in (["arco", "wb2"] if a.kind == "both" else [a.kind]):
        d = write(a.out, kind, a.size, times, npres, nsurf)
        print(json.dumps(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
