"""Physical constants of the toy atmosphere (`credit.data.physics`) and its forcing."""

EARTH_RADIUS = 6.371e6  # m
OMEGA = 7.292e-5  # s-1
GRAVITY = 9.80665  # m s-2
R_DRY = 287.04  # J kg-1 K-1
LATENT_OVER_CP = 2.501e6 / 1004.0  # K per (kg kg-1)
SOLAR_CONSTANT = 1361.0  # W m-2
LAPSE_RATE = 6.5e-3  # K m-1
NS_PER_DAY = 86_400 * 10**9
