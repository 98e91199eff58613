# jobscripts fragment
