"""Published device measurements behind `heterogeneity.profile = phones` (pollen.core.pacing,
docs/pacing.md#devices): each table is the percentiles 0, 1, ..., 100 of the measured values,
rounded to four significant digits, as experiments/device_tables.py derives them from the
sources' files (and checks them against this module).
"""

from __future__ import annotations

# fmt: off
PHONE_CPU_SCORES: tuple[float, ...] = (
    105, 118.9, 150, 204.9, 208.3, 218.4, 231.5, 240.2, 252.2, 262.9,
    274.2, 278, 282, 288.3, 296.8, 311.4, 335.1, 347, 372.7, 381.2,
    392.2, 431.1, 450.3, 479.4, 552.7, 568, 596, 603.2, 625.8, 728.5,
    754.6, 785.9, 801.7, 1055, 1081, 1142, 1195, 1274, 1299, 1304,
    1327, 1337, 1401, 1408, 1427, 1445, 1468, 1491, 1502, 1517,
    1548, 1552, 1568, 1582, 1611, 1636, 1649, 1660, 1679, 1684,
    1696, 1740, 1772, 1799, 1884, 1926, 1969, 1984, 2003, 2016,
    2035, 2055, 2083, 2117, 2142, 2154, 2186, 2213, 2241, 2342,
    2621, 2738, 2761, 2899, 3026, 3062, 3109, 3147, 3208, 3241,
    3414, 3472, 3484, 3525, 3645, 3691, 3741, 3816, 3982, 4185,
    4310,
)
"""AI Benchmark's CPU floating-point score (`CPU_F_AI_Score`) of each of the 333 Android phone
models in its ranking as of January 2020, phones released 2009-2019 (the benchmark: Ignatov et
al., "AI Benchmark: All About Deep Learning on Smartphones in 2019", ICCV Workshops 2019, whose
results its website keeps up to date; the copy of the ranking in FLASH's repository,
github.com/PKU-Chengxu/FLASH, `models/utils/device_util/raw_ai_benchmark_list.json`, Yang et
al., "Characterizing Impacts of Heterogeneity in Federated Learning upon Large-Scale Smartphone
Data", WWW 2021). A higher score is a faster phone; each model counts once, whatever its
number of owners."""

BANDWIDTH_MBPS: dict[str, tuple[float, ...]] = {
    "wifi": (
        0.1, 0.6, 1.8, 3.3, 4.9, 6.6, 8.5, 10.1, 11.69, 13.7,
        16.3, 18.6, 20.8, 23, 25.5, 27.8, 30.1, 32.6, 35.1, 37.2,
        39.5, 41.7, 43.88, 46.1, 48.3, 50.6, 52.8, 55.1, 57.5, 60.1,
        62.9, 66.1, 69.27, 72.5, 75.5, 78.8, 82.2, 85.3, 88, 91.1,
        94, 96.7, 99.6, 101.8, 103.9, 105.7, 107.4, 108.7, 109.7, 110.5,
        110.9, 111.3, 111.7, 115.3, 123.1, 131.3, 139.4, 148.2, 155.6, 163.1,
        175.7, 188.5, 200.7, 214.5, 228.1, 239.7, 251.7, 263.9, 273, 281.8,
        289.5, 296.7, 306, 316.6, 328, 340.9, 353, 363.9, 375.2, 384.8,
        395.9, 403.9, 412.5, 422.1, 432.3, 446, 462.9, 482.7, 503, 523.8,
        548.5, 573.7, 601.8, 633.2, 665.5, 696.9, 738.7, 796.3, 879.3, 990.1,
        1527,
    ),
    "4g": (
        0.1, 0.2, 0.5, 0.7, 0.9, 1.1, 1.2, 1.4, 1.7, 2.1,
        2.4, 2.8, 3.1, 3.4, 3.7, 3.985, 4.3, 4.8, 5.2, 5.9,
        6.4, 6.879, 7.3, 7.7, 8.4, 8.9, 9.4, 9.8, 10.4, 11,
        11.6, 12.2, 12.7, 13.1, 13.5, 14.1, 14.8, 15.46, 16.1, 16.8,
        17.6, 18.4, 19.3, 20, 20.8, 21.56, 22.4, 23.1, 24, 25,
        26.1, 27, 27.9, 28.8, 29.7, 30.8, 31.9, 32.9, 33.9, 35,
        36.1, 37.24, 38.4, 39.8, 41.2, 42.8, 44, 45.3, 46.9, 48.1,
        49.53, 51.1, 53, 54.6, 56, 57.6, 59.02, 61.02, 62.9, 64.8,
        67.42, 70.4, 73.02, 75.8, 79.1, 82.4, 87.01, 92.2, 97.61, 103.4,
        109.9, 119.1, 134.7, 151.3, 184.2, 240.7, 284.3, 318.3, 364.1, 448.1,
        801.5,
    ),
    "5g": (
        0.1, 1, 1.7, 3.6, 5.6, 10.4, 15.79, 22.4, 28.1, 35.19,
        41.99, 47.58, 54.2, 62, 69.7, 77.6, 84.7, 92.1, 99.9, 105.9,
        113.4, 120.4, 128.1, 135.3, 142.9, 150.7, 158.2, 165.6, 172.6, 181,
        187.9, 194.9, 202, 209.7, 217.3, 224.1, 230, 236.2, 242.8, 249.1,
        254.6, 261.6, 269.1, 275.1, 280.4, 286.3, 291.3, 296.8, 302, 307.5,
        312.8, 316.9, 321.7, 326.3, 331, 334.5, 337.9, 340.5, 343.1, 345.8,
        348.7, 351.7, 354.4, 357.4, 359.6, 362.7, 365.7, 369.5, 374, 378.3,
        383.4, 388.1, 393.6, 399.8, 406, 414.4, 424.5, 434.6, 444.9, 454.5,
        462.7, 470.8, 480.9, 492.1, 503.2, 514.1, 524.9, 535.3, 544.4, 554.6,
        563.5, 571.6, 580.3, 589, 600.2, 621.3, 656.3, 703.3, 782.4, 874.4,
        1296,
    ),
}
"""Measured access bandwidth of Android phones in China, Mbit/s, by network: the tests released
with "Mobile Access Bandwidth in Practice: Measurement, Analysis, and Implications" (Yang et
al., SIGCOMM 2022; github.com/mobilebandwidth/mobilebandwidth.github.io, `data/*.csv`, column
`bandwidth_Mbps`, Apache-2.0): 'wifi' pools its 10,000 tests over each of WiFi 4, 5 and 6,
'4g' and '5g' are 10,000 tests each. The tests download from a nearby server for ten seconds,
so these are downlink figures."""
# fmt: on
