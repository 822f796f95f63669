"""placeholder"""


class ILP:
    pass
