# Shared test helpers; each layer's tests are listed in that layer's fragment.
