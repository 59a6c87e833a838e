"""Kernel-level analyses of the paper: ExpCast's byte map (Fig. 5, App. C/D), the output error
split of Equation 2 (Fig. 3a), and the token orders of V-Smooth (Table 1, Fig. 4)."""
